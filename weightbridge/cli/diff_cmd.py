"""``weightbridge diff A B``: compare two layout IRs of one rank.

A and B are each ``SPEC.yaml:SIDE:RANK`` (the spec's expansion), or a JSON file: probe
output (``weightbridge probe`` / ``write_probe_json``), ``weightbridge explain --json``
output, or any ``RankLayout.to_json()`` (e.g. DTensor introspection). Pieces are
normalised (adjacent boxes merged, order ignored) before comparing.

Exit codes: 0 identical, 1 different, 2 user error (unreadable source, bad spec).
"""

from __future__ import annotations

import argparse
import json
import sys

from weightbridge.cli.common import PATH_MAX, EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError, excerpt, nonneg_int, show


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="compare two layout IRs of one rank (spec expansion, probe output, DTensor JSON)")
    p.add_argument("a", metavar="A", help="SPEC.yaml:SIDE:RANK or a layout / probe JSON file")
    p.add_argument("b", metavar="B", help="SPEC.yaml:SIDE:RANK or a layout / probe JSON file")
    p.add_argument("--ignore-dtype", action="store_true", help="compare boxes only, not local dtypes")
    p.add_argument("--strict", action="store_true", help="also compare local tensors that hold no canonical element")
    p.add_argument("--limit", type=nonneg_int, default=20, help="tensors to show at most (default 20)")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from weightbridge.layout.ir import layout_hash
    from weightbridge.probe.diff import SourceError, diff_layouts, format_diff, load_source, normalize_layout

    for name, value in (("A", args.a), ("B", args.b)):
        if "\0" in value:
            raise UsageError(f"{name}: contains a NUL byte: {show(value)}")
        if len(value) > PATH_MAX + 64:
            raise UsageError(f"{name}: too long for a path ({len(value):,} chars): {excerpt(value)}")
    try:
        a = load_source(args.a)
        b = load_source(args.b)
    except SourceError as exc:
        lines = [excerpt(line, 600) for line in str(exc).splitlines()[:100]]  # bounded echo
        print("weightbridge diff: " + "\n".join(lines), file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path the OS refuses (a name too long, a directory, ...)
        raise UsageError(f"cannot read {excerpt(str(exc.filename or ''))}: {exc.strerror or exc}") from None
    except RecursionError:
        raise UsageError("a layout JSON is nested too deeply to be one") from None
    diffs = diff_layouts(a, b, dtypes=not args.ignore_dtype, strict=args.strict)
    if args.json:
        json.dump(
            {
                "identical": not diffs,
                "hash_a": layout_hash([normalize_layout(a)]),
                "hash_b": layout_hash([normalize_layout(b)]),
                "tensors": [
                    {
                        "name": d.name,
                        "message": d.message,
                        "only_a": [str(p) for p in d.only_a[:3]],
                        "only_b": [str(p) for p in d.only_b[:3]],
                    }
                    for d in diffs
                ],
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    elif diffs:
        print(f"{len(diffs)} tensor(s) differ between A ({excerpt(args.a)}) and B ({excerpt(args.b)}):")
        print(format_diff(diffs, limit=args.limit))
    else:
        n = sum(1 for t in a.tensors if t.pieces)
        print(f"identical: {n} tensor(s) (normalised hash {layout_hash([normalize_layout(a)])})")
    return EXIT_FAIL if diffs else EXIT_OK
