"""``weightbridge docs [NAME]``: the shipped documentation (docs/, integration guides, spec reference).

Without NAME, lists each document with its installed path; with NAME (``planner``, ``probing``,
``guide/vllm``, ``spec``, ...), prints it. Error hints name these documents, and a wheel install
has no repository to look them up in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weightbridge import shipped
from weightbridge.cli.common import EXIT_OK, EXIT_USAGE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="list the shipped documentation, or print one document")
    p.add_argument("name", nargs="?", help="a document's name, e.g. planner, probing, spec, guide/vllm")
    p.set_defaults(func=run)


def documents() -> dict[str, Path]:
    """Document name -> shipped path (markdown only)."""
    out: dict[str, Path] = {}
    root = shipped.root()
    for rel in shipped.files():
        if not rel.endswith(".md"):
            continue
        p = Path(rel)
        if p.parts[0] == "docs":
            out[p.stem] = root / rel
        elif p.parts[0] == "integration_guides":
            out["guide/" + ("checklist" if p.stem == "README" else p.stem)] = root / rel
        elif rel == "spec/README.md":
            out["spec"] = root / rel
        elif rel == "examples/toy_integration/README.md":
            out["toy_integration"] = root / rel
        elif len(p.parts) == 1:
            out[p.stem.lower()] = root / rel
    return dict(sorted(out.items()))


def run(args: argparse.Namespace) -> int:
    docs = documents()
    if args.name is None:
        for n, p in docs.items():
            print(f"{n:24s} {p}")
        return EXIT_OK
    name = args.name.removesuffix(".md")
    if name not in docs:
        shown = name if len(name) <= 80 else name[:80] + f"... ({len(name)} chars)"
        print(f"weightbridge docs: no document {shown!r}; choose from: {', '.join(docs)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(docs[name].read_text(encoding="utf-8"))
    return EXIT_OK
