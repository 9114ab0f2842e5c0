"""``weightbridge validate SPEC...``: schema + semantic checks, every problem, exit 2 on any.

A valid spec whose side has no ``pins`` gets a warning on stderr (``warnings`` in ``--json``): its
layout was never checked against a live loader (:func:`weightbridge.spec.sides.unchecked_sides`)."""

from __future__ import annotations

import argparse
import sys

from weightbridge.cli.common import EXIT_OK, EXIT_USAGE, print_json
from weightbridge.spec.resolve import check_spec
from weightbridge.spec.sides import unchecked_sides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check specs against the schema and the model; report every problem")
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print problems as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    failed = 0
    report = []
    for path in args.specs:
        resolved, problems = check_spec(path)
        if problems:
            failed += 1
            if not args.json:
                for p in problems:
                    print(p, file=sys.stderr)
        warnings = unchecked_sides(resolved.spec) if resolved is not None and not problems else []
        if not problems and not args.json and resolved is not None:
            t, r = resolved.trainer, resolved.rollout
            print(
                f"{path}: ok — {len(resolved.canonical)} canonical tensors; "
                f"trainer {t.world_size} ranks, rollout {r.num_instances} x {r.world_size // max(1, r.num_instances)} ranks"
            )
            for w in warnings:
                print(f"{path}: warning: {w}", file=sys.stderr)
        report.append({"spec": path, "valid": not problems, "problems": [p.to_json() for p in problems],
                       "warnings": warnings})
    if args.json:
        print_json(report if len(report) > 1 else report[0])
    elif failed:
        total = sum(len(r["problems"]) for r in report)
        print(f"{total} problem(s) in {failed} spec(s)", file=sys.stderr)
    return EXIT_USAGE if failed else EXIT_OK
