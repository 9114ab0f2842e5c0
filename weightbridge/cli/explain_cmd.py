"""``weightbridge explain SPEC --side S --rank R [--tensor NAME] [--json]``.

Shows how each local tensor of one rank is composed of canonical boxes.

JSON form (stable; boxes are lists of ``[start, stop]``)::

    {"side": "rollout", "rank": 1, "instance": 0, "local_rank": 1, "coords": {"tp": 1, ...},
     "tensors": [{"name", "shape", "dtype",
                  "pieces": [{"canonical", "canonical_box", "local_box", "transpose"}]}],
     "casts": [{"tensor", "canonical", "checkpoint_dtype", "dtype"}]}   # only when there are any

``casts``: values that pass through the checkpoint's narrower dtype on their way into a wider
local tensor (what an engine loading the checkpoint holds; they cross the wire in that dtype).
"""

from __future__ import annotations

import argparse
import sys

from weightbridge.cli.common import EXIT_OK, EXIT_USAGE, UsageError, load_rank_or_report, print_json, show
from weightbridge.layout.box import format_box
from weightbridge.layout.explain import explain_json, select_tensors, tensor_casts


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="show how one rank's local tensors are made of canonical boxes")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--side", choices=("trainer", "rollout"), required=True)
    p.add_argument("--rank", type=int, required=True, help="rank within the side (rollout ranks count across instances)")
    p.add_argument("--tensor", default=None, help="only local tensors whose name, or a canonical source name, matches (glob)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


MAX_GLOB = 1000  # characters; tensor names are far shorter


def run(args: argparse.Namespace) -> int:
    if args.tensor is not None and len(args.tensor) > MAX_GLOB:
        raise UsageError(
            f"--tensor: a glob of {len(args.tensor):,} characters; tensor names are shorter (at most {MAX_GLOB})"
        )
    loaded = load_rank_or_report(args.spec, args.side, args.rank)
    if loaded is None:
        return EXIT_USAGE
    resolved, rank = loaded
    casts = dict(resolved.side(args.side).casts)
    tensors = select_tensors(rank, args.tensor)
    if args.tensor is not None and not tensors:
        print(f"no local tensor of {args.side} rank {args.rank} matches {show(args.tensor)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print_json(explain_json(rank, tensors, casts))
        return EXIT_OK
    from rich.console import Console
    from rich.markup import escape

    console = Console(soft_wrap=True, highlight=False)
    coords = " ".join(f"{k}={v}" for k, v in rank.coords)
    console.print(f"[bold]{args.side} rank {rank.rank}[/] (instance {rank.instance}, local rank {rank.local_rank}; {coords})")
    through = {}
    for c in tensor_casts(tensors, casts):
        through.setdefault(c["tensor"], set()).add(c["checkpoint_dtype"])
    for t in tensors:
        cast = "".join(f" [yellow](values through the checkpoint's {d})[/]" for d in sorted(through.get(t.name, ())))
        console.print(f"[cyan]{escape(t.name)}[/] {list(t.shape)} {t.dtype}{cast}")
        if not t.pieces:
            console.print("    (padding only)")
        for p in t.pieces:
            tr = ".T" if p.transpose else ""
            console.print(f"    {format_box(p.local_box):<24} <- {escape(p.canonical)}{format_box(p.canonical_box)}{tr}")
    return EXIT_OK
