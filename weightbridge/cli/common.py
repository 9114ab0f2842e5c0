"""Helpers shared by CLI subcommands: spec loading with user-facing errors, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from weightbridge.layout.ir import RankLayout
from weightbridge.spec.errors import SpecErrors
from weightbridge.spec.resolve import ResolvedSpec, resolve_spec

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def load_or_report(path: str) -> ResolvedSpec | None:
    """The resolved spec, or None after printing every problem to stderr (caller exits 2)."""
    try:
        return resolve_spec(path)
    except SpecErrors as exc:
        print(str(exc), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) found", file=sys.stderr)
        return None


def load_rank_or_report(path: str, side: str, rank: int) -> tuple[ResolvedSpec, RankLayout] | None:
    """The resolved spec and one rank's layout, or None after printing why (caller exits 2)."""
    resolved = load_or_report(path)
    if resolved is None:
        return None
    layout = resolved.side(side)
    if not 0 <= rank < layout.world_size:
        print(f"{path}: --rank {rank} out of range: the {side} has ranks 0..{layout.world_size - 1}", file=sys.stderr)
        return None
    return resolved, layout.ranks[rank]


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
