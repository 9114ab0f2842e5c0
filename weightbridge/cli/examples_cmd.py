"""``weightbridge examples [NAME] [--copy DIR]``: the shipped example specs and example directories.

Lists them with their installed paths, prints one spec, or copies a spec (or all of them, or an
example directory: the out-of-tree ``toy_integration``, the ``engine_suites`` weightbridge's own
engine integrations pass, the engine ``bench`` scripts) into a directory of the user's, so a wheel install has the same starting
points as a source checkout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weightbridge import shipped
from weightbridge.cli.common import EXIT_OK, EXIT_USAGE, print_json

TOY = "toy_integration"
#: example directories: name -> (shipped directory, what it is)
DIRS = {
    TOY: (f"examples/{TOY}", "an out-of-tree integration passing the conformance suite"),
    "engine_suites": ("examples/engine_suites",
                      "the conformance suites of weightbridge's vLLM and SGLang integrations (README.md)"),
    "bench": ("bench", "the engine benchmarks: vllm_update.py, sglang_update.py"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("examples", help="list the shipped example specs, toy integration and engine suites, print one, "
                                        "or copy them out")
    p.add_argument("name", nargs="?", help=f"an example spec's name, or one of {', '.join(map(repr, DIRS))}")
    p.add_argument("--copy", metavar="DIR", type=Path, help="copy NAME (default: every example spec) into DIR")
    p.add_argument("--json", action="store_true", help="list as JSON")
    p.set_defaults(func=run)


def _fail(msg: str) -> int:
    print(f"weightbridge examples: {msg}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    specs = shipped.example_specs()
    name = args.name
    if name is not None and name not in DIRS and name not in specs:
        shown = name if len(name) <= 80 else name[:80] + f"... ({len(name)} chars)"
        return _fail(f"no example {shown!r}; choose from: {', '.join([*specs, *DIRS])}")
    if args.copy is not None:
        return _copy(name, specs, args.copy)
    if name in DIRS:
        print(shipped.path(DIRS[name][0]))
        return EXIT_OK
    if name is not None:
        sys.stdout.write(specs[name].read_text(encoding="utf-8"))
        return EXIT_OK
    if args.json:
        print_json({"specs": {n: str(p) for n, p in specs.items()},
                    **{d: str(shipped.path(rel)) for d, (rel, _) in DIRS.items()}})
        return EXIT_OK
    for n, p in specs.items():
        print(f"{n:62s} {p}")
    for d, (rel, what) in DIRS.items():
        print(f"{d:62s} {shipped.path(rel)}  ({what})")
    print("print one: weightbridge examples NAME; copy: weightbridge examples [NAME] --copy DIR", file=sys.stderr)
    return EXIT_OK


def _copy(name: str | None, specs: dict[str, Path], dest: Path) -> int:
    try:
        if dest.exists() and not dest.is_dir():
            return _fail(f"--copy {str(dest)[:200]}: not a directory")
        if name in DIRS:
            written = shipped.copy_out(DIRS[name][0], dest / name)
        else:
            chosen = [specs[name]] if name else list(specs.values())
            clash = [dest / p.name for p in chosen if (dest / p.name).exists()]
            if clash:
                return _fail(f"{clash[0]} exists; not overwriting")
            dest.mkdir(parents=True, exist_ok=True)
            written = []
            for p in chosen:
                (dest / p.name).write_bytes(p.read_bytes())
                written.append(dest / p.name)
    except FileExistsError as exc:
        return _fail(str(exc))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        return _fail(f"cannot copy into {str(dest)[:200]}: {getattr(exc, 'strerror', None) or exc}")
    for p in written:
        print(p)
    return EXIT_OK
