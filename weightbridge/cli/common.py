"""Helpers shared by CLI subcommands: spec loading with user-facing errors, argument checks, JSON output.

User errors exit 2 (:data:`EXIT_USAGE`) with one line on stderr (spec problems: one
``file:line: $.path: message (hint)`` line each), never a traceback; every user value echoed
is bounded (:func:`excerpt`). Raise :class:`UsageError` from a subcommand for a one-line error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from weightbridge.layout.ir import RankLayout
from weightbridge.spec.errors import SpecErrors, excerpt, show
from weightbridge.spec.resolve import ResolvedSpec, resolve_spec

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERNAL = 3  # a bug in weightbridge (an unexpected exception), never a user error
PATH_MAX, NAME_MAX = 4096, 255

__all__ = [
    "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "EXIT_USAGE", "UsageError", "byte_size_arg", "check_output_path",
    "check_path_arg", "excerpt", "load_or_report", "load_rank_or_report", "nonneg_int", "positive_float",
    "positive_int", "print_json", "show",
]


class UsageError(Exception):
    """A user error the CLI reports as one line on stderr, exit 2 (see ``weightbridge.cli.main``)."""


def check_path_arg(value: str, what: str) -> str:
    """``value`` if it can name a file at all; UsageError for NUL bytes and over-long paths."""
    if "\0" in value:
        raise UsageError(f"{what}: the path contains a NUL byte: {show(value)}")
    raw = os.fsencode(value)
    if len(raw) >= PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise UsageError(
            f"{what}: path too long ({len(raw):,} bytes; at most {PATH_MAX - 1}, {NAME_MAX} per name): {excerpt(value)}"
        )
    return value


def check_output_path(value: str, what: str) -> Path:
    """The path an output goes to, checked before any work is done: not a directory, in a writable directory."""
    check_path_arg(value, what)
    path = Path(value)
    if path.is_dir() or value.endswith(("/", os.sep)):
        raise UsageError(f"{what} {excerpt(value)}: is a directory; give a file name")
    parent = path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise UsageError(f"{what} {excerpt(value)}: {excerpt(str(parent))} {why}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {excerpt(value)}: not writable")
    return path


# ---- argparse types (a ValueError / ArgumentTypeError becomes a usage error, exit 2) ----------


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {excerpt(text, 40)}")
    return value


def nonneg_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {excerpt(text, 40)}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {show(text, 40)}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {excerpt(text, 40)}")
    return value


def byte_size_arg(text: str) -> int:
    """Bytes as an integer or a size (``64MiB``), at least the spec's minimum round size."""
    from weightbridge.spec.models import MIN_ROUND_BYTES, parse_bytes

    value = parse_bytes(text.strip()) if len(text) < 40 else text
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected bytes (an integer or a size such as 64MiB), got {show(text, 40)}"
            ) from None
    if value < MIN_ROUND_BYTES:
        raise argparse.ArgumentTypeError(f"expected at least {MIN_ROUND_BYTES} bytes (4KiB), got {excerpt(text, 40)}")
    return value


def _int(text: str) -> int:
    try:
        if len(text) < 40:
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected an integer, got {show(text, 40)}")


# ---- specs -----------------------------------------------------------------------------------


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
        last = layout.world_size - 1
        print(f"{excerpt(path)}: --rank {rank} out of range: the {side} has ranks 0..{last}", file=sys.stderr)
        return None
    return resolved, layout.ranks[rank]


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
