"""``weightbridge plan SPEC [--json] [--render plan.png]``: plan one update, validate it, price it.

Exit codes: 0 the plan is valid; 1 the plan has problems (listed); 2 the spec has errors.

The ``--json`` object is documented in :mod:`weightbridge.plan.metrics` (keys are stable).
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan one weight update: rounds, balance, predicted time vs baseline")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print the metrics object as JSON")
    p.add_argument("--render", metavar="PNG", default=None, help="draw the sender x receiver matrix and round loads")
    p.add_argument("--receiver-dedup", choices=("auto", "on", "off"), default="auto",
                   help="rollout instances complete shards among themselves (auto: when the cost model says it pays)")
    p.add_argument("--network", default=None, help="override the spec's network preset (h100, h200, cpu-gloo)")
    p.add_argument("--round-bytes", type=int, default=None, help="override sync.round_bytes (bytes)")
    p.add_argument("--max-problems", type=int, default=50, help="problems printed in the summary (all in --json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from weightbridge.spec.errors import SpecErrors
    from weightbridge.spec.resolve import resolve_spec

    try:
        resolved = resolve_spec(args.spec)
    except SpecErrors as exc:
        print(str(exc), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) found", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"{args.spec}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE

    from weightbridge.spec.planning import plan_spec

    try:
        report = plan_spec(resolved, network=args.network, round_bytes=args.round_bytes,
                           receiver_dedup=args.receiver_dedup)
    except SpecErrors as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    plan, problems, m = report.plan, report.problems, report.metrics
    if args.render:
        from weightbridge.plan.render import render_png

        render_png(plan, args.render, title=str(args.spec))
    if args.json:
        from weightbridge.cli.common import print_json

        print_json(m)
        return EXIT_FAIL if problems else EXIT_OK

    from rich.console import Console
    from rich.markup import escape

    from weightbridge.plan.render import balance_reason, summary_table

    console = Console(soft_wrap=True, highlight=False)
    console.print(summary_table(m, plan, title=f"weightbridge plan {escape(str(args.spec))}"))
    reason = balance_reason(m)
    if reason:
        console.print(f"note: {escape(reason)}")
    for note in plan.notes:
        console.print(f"note: {escape(note)}")
    if args.render:
        console.print(f"rendered {escape(args.render)}")
    if problems:
        for p in problems[: args.max_problems]:
            console.print(f"[red]problem[/] {escape(str(p))}")
        more = len(problems) - args.max_problems
        if more > 0:
            console.print(f"... and {more} more (all of them in --json)")
        console.print(f"[red]{len(problems)} problem(s)[/]")
        return EXIT_FAIL
    console.print("[green]plan is valid[/]: every element each rollout rank needs arrives exactly once")
    return EXIT_OK
