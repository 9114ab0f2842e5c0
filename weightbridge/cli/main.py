"""``weightbridge`` command line: one subcommand per module in ``weightbridge.cli``.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and
sets ``func(args) -> int`` (the exit code). User errors exit 2 with
``file:line: $.path: message (hint)`` lines (spec problems) or one line (anything else) on
stderr, and no traceback; each echoed user value is bounded (~200 characters). Exit 1 keeps the
meaning each subcommand documents (``diff``: a difference; ``plan``: plan problems).

Exit codes: 0 ok; 1 the subcommand's documented failure; 2 user error (bad arguments, bad spec,
unreadable or unwritable file); 3 internal error (a bug: an unexpected exception, reported in one
line; ``WEIGHTBRIDGE_DEBUG=1`` shows its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from weightbridge.cli.common import EXIT_INTERNAL, EXIT_USAGE, UsageError
from weightbridge.spec.errors import excerpt

_LONG_WORD = re.compile(r"\S{200,}")


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors that never echo more than a short excerpt of what was given."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = _LONG_WORD.sub(lambda m: excerpt(m.group(0)), message)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {excerpt(message, 600)}\n")


# Subcommand modules, in help order. A module missing here is simply not offered.
_COMMANDS = ("validate", "explain", "plan", "schema", "presets", "models", "demo", "probe", "fit", "diff", "rules",
             "examples", "docs", "store", "secret")


DISTRIBUTION = "weightbridge-rl"  # the name pip knows it by; `import weightbridge`, command `weightbridge`


def version_line() -> str:
    """``weightbridge --version``: the version, and the distribution's name (``pip show weightbridge`` finds nothing)."""
    from importlib.metadata import PackageNotFoundError, version

    from weightbridge import __version__

    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:  # a source checkout on PYTHONPATH, not installed
        return f"weightbridge {__version__} (not installed as a distribution; pip knows it as {DISTRIBUTION})"
    return f"weightbridge {installed} (distribution {DISTRIBUTION}: pip show {DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="weightbridge",
        description="Move updated model weights from RL trainers to rollout engines: exact bytes, once, balanced.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        try:
            mod = importlib.import_module(f"weightbridge.cli.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name == f"weightbridge.cli.{name}_cmd":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.stderr.close()
        return 0
    except UsageError as exc:
        print(f"weightbridge {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"weightbridge {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # last resort: a bug, not a user error; one line, no traceback
        if os.environ.get("WEIGHTBRIDGE_DEBUG"):
            raise
        try:
            what = excerpt(str(exc), 300)
        except Exception:  # noqa: BLE001 - even str() may fail on a broken exception
            what = ""
        print(
            f"weightbridge {args.command}: internal error: {type(exc).__name__}: {what} "
            "(a bug in weightbridge: please report it; WEIGHTBRIDGE_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
