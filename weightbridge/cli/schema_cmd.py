"""``weightbridge schema [--check] [--path P]``: print, write or check the spec JSON Schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weightbridge import shipped
from weightbridge.spec.schema import default_schema_path, schema_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the spec JSON Schema, write it (--write) or check the committed copy (--check)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if the committed (or shipped) schema differs from the models")
    g.add_argument("--write", action="store_true", help="regenerate the committed schema file (source checkout) or write --path")
    p.add_argument("--path", type=Path, default=None,
                   help="schema file (default: spec/schema/ of this checkout, or the installed package's copy)")
    p.set_defaults(func=run)


def _usage(msg: str) -> int:
    print(f"weightbridge schema: {msg}", file=sys.stderr)
    return 2


def _write(path: Path, text: str, explicit: bool) -> int:
    if not explicit and shipped.installed():
        return _usage(f"{path} ships with the installed package and is not to be edited; "
                      "give --path FILE to write the schema elsewhere")
    if path.is_dir():
        return _usage(f"{path} is a directory; give a file path (e.g. {path / default_schema_path().name})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except (OSError, ValueError) as exc:  # ValueError: NUL byte in the path
        return _usage(f"cannot write {str(path)[:200]!s}: {getattr(exc, 'strerror', None) or exc}")
    print(f"wrote {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    path = args.path or default_schema_path()
    text = schema_text()
    if args.write:
        return _write(path, text, explicit=args.path is not None)
    if args.check:
        try:
            current = path.read_text(encoding="utf-8")
        except (OSError, ValueError, UnicodeDecodeError):
            print(f"{str(path)[:200]}: missing or unreadable; "
                  + ("run `weightbridge schema --write`" if not shipped.installed() else "reinstall weightbridge-rl"),
                  file=sys.stderr)
            return 1
        if current != text:
            print(f"{path}: out of date with weightbridge.spec.models; "
                  + ("run `weightbridge schema --write`" if not shipped.installed() else "reinstall weightbridge-rl"),
                  file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    sys.stdout.write(text)
    return 0
