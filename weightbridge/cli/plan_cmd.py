"""``weightbridge plan SPEC [--json] [--render plan.png]``: plan one update, validate it, price it.

The output states where the cost model places the ranks (``placement``: which nodes each side's
ranks are on), the assumption every predicted time rests on.

Exit codes: 0 the plan is valid; 1 the plan has problems (listed); 2 user error (the spec has
errors, a bad option, an output path that cannot be written).

The ``--json`` object is documented in :mod:`weightbridge.plan.metrics` (keys are stable).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from weightbridge.cli.common import (
    EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError, byte_size_arg, check_output_path, excerpt, nonneg_int,
)

RENDER_FORMATS = (".png", ".svg", ".pdf")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan one weight update: rounds, balance, predicted time vs baseline")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print the metrics object as JSON")
    p.add_argument("--render", metavar="PNG", default=None,
                   help="draw the sender x receiver matrix and round loads (.png, .svg or .pdf; no suffix: .png)")
    p.add_argument("--receiver-dedup", choices=("auto", "on", "off"), default=None,
                   help="override sync.receiver_dedup: rollout instances complete shards among themselves "
                   "(auto: when the cost model says it pays)")
    p.add_argument("--network", default=None, help="override the spec's network preset (h100, h200, gb200, cpu-gloo)")
    p.add_argument("--round-bytes", type=byte_size_arg, default=None, metavar="BYTES",
                   help="override sync.round_bytes (an integer or a size such as 64MiB; at least 4KiB)")
    p.add_argument("--change-rate", type=change_rate_arg, default=None, metavar="F",
                   help="expected share of elements a push changes (0..1, e.g. 0.01): also predict the time "
                   "and wire bytes with delta updates (sync.delta)")
    p.add_argument("--max-problems", type=nonneg_int, default=50,
                   help="problems printed in the summary (all in --json)")
    p.set_defaults(func=run)


def change_rate_arg(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {excerpt(value)}") from None
    if not 0.0 <= f <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{excerpt(value)}: a change rate is within [0, 1]")
    return f


def render_path(value: str) -> Path:
    """The file ``--render VALUE`` writes: VALUE itself, or VALUE.png without a suffix; checked before planning."""
    path = check_output_path(value, "--render")
    if not path.suffix:
        path = check_output_path(value + ".png", "--render")
    if path.suffix.lower() not in RENDER_FORMATS:
        raise UsageError(f"--render {excerpt(value)}: use a {', '.join(RENDER_FORMATS)} file name")
    return path


def _render(plan, path: Path, title: str) -> None:
    """Draw into a temporary file beside ``path``, then rename: a failed render leaves nothing behind."""
    from weightbridge.plan.render import render_png

    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        render_png(plan, str(tmp), title=title)
        os.replace(tmp, path)
    except RuntimeError as exc:  # matplotlib missing
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--render {excerpt(str(path))}: cannot write: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from weightbridge.spec.errors import SpecErrors
    from weightbridge.spec.resolve import resolve_spec
    from weightbridge.spec.sides import round_bytes_problem

    render = render_path(args.render) if args.render is not None else None
    try:
        resolved = resolve_spec(args.spec)
    except SpecErrors as exc:
        print(str(exc), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) found", file=sys.stderr)
        return EXIT_USAGE
    if args.round_bytes is not None:
        too_fine = round_bytes_problem(resolved.rollout, args.round_bytes)
        if too_fine is not None:
            raise UsageError(f"--round-bytes: {too_fine[0]} ({too_fine[1]})")

    from weightbridge.ops.planning import plan_spec

    try:
        report = plan_spec(resolved, network=args.network, round_bytes=args.round_bytes,
                           receiver_dedup=args.receiver_dedup, change_rate=args.change_rate)
    except SpecErrors as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    plan, problems, m = report.plan, report.problems, report.metrics
    if render is not None:
        _render(plan, render, title=excerpt(str(args.spec), 120))
    if args.json:
        from weightbridge.cli.common import print_json

        print_json(m)
        if render is not None:
            print(f"rendered {render}", file=sys.stderr)
        return EXIT_FAIL if problems else EXIT_OK

    from rich.console import Console
    from rich.markup import escape

    from weightbridge.plan.render import balance_reason, summary_table

    console = Console(soft_wrap=True, highlight=False)
    cpu = report.network.name == "cpu-gloo" or resolved.sync.transport == "gloo"  # no GPU to stall
    console.print(summary_table(m, plan, title=f"weightbridge plan {escape(str(args.spec))}", gpus=not cpu))
    console.print(f"placement: {escape(m['placement']['text'])} (the network model's assumption; a spec's "
                  f"network: {{preset: {escape(m['network'])}, ranks_per_node: N, shared_nodes: true|false}} changes it)")
    reason = balance_reason(m)
    if reason:
        console.print(f"note: {escape(reason)}")
    for note in plan.notes:
        console.print(f"note: {escape(note)}")
    if render is not None:
        console.print(f"rendered {escape(str(render))}")
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
