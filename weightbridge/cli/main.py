"""``weightbridge`` command line: one subcommand per module in ``weightbridge.cli``.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and
sets ``func(args) -> int`` (the exit code). User errors exit 2 with
``file:line: $.path: message (hint)`` lines and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in help order. A module missing here is simply not offered.
_COMMANDS = ("validate", "explain", "plan", "schema", "presets", "models", "demo", "probe", "diff", "examples", "docs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="weightbridge",
        description="Move updated model weights from RL trainers to rollout engines: exact bytes, once, balanced.",
    )
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


if __name__ == "__main__":
    sys.exit(main())
