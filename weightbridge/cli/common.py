"""Helpers shared by CLI subcommands: spec loading with user-facing errors, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

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


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
