"""``weightbridge schema [--check] [--path P]``: print, write or check the spec JSON Schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weightbridge.spec.schema import default_schema_path, schema_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the spec JSON Schema, write it (--write) or check the committed copy (--check)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if the committed schema differs from the models")
    g.add_argument("--write", action="store_true", help="regenerate the committed schema file")
    p.add_argument("--path", type=Path, default=None, help="schema file (default: spec/schema/ of this checkout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = args.path or default_schema_path()
    text = schema_text()
    if args.write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
        return 0
    if args.check:
        try:
            current = path.read_text()
        except OSError:
            print(f"{path}: missing; run `weightbridge schema --write`", file=sys.stderr)
            return 1
        if current != text:
            print(f"{path}: out of date with weightbridge.spec.models; run `weightbridge schema --write`", file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    sys.stdout.write(text)
    return 0
