"""``weightbridge demo``: run a trainer world and a rollout world on CPU/Gloo, verify every update bitwise."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run FSDP2 trainers -> vLLM-style rollouts on CPU/Gloo and verify every update bitwise",
        description=(
            "Spawn 2 FSDP2 trainer ranks (a small Qwen2-style model doing AdamW steps) and 2 vLLM-style "
            "rollout instances of TP 2 on this machine, push every update through weightbridge in sync "
            "and async mode, and check every rollout tensor bitwise against the trainer's weights. "
            "Exit 0 only if everything matched."
        ),
    )
    p.add_argument("--modes", default="sync,async", help="comma-separated modes, in order (default: %(default)s)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (= versions) per mode (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="hard wall-clock limit, s (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (with \"verified\": true|false)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from weightbridge.demo.run import main

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ("sync", "async")]
    if bad or not modes or args.steps < 1:
        print(f"weightbridge demo: --modes takes sync and/or async, --steps >= 1 (got {args.modes!r}, {args.steps})")
        return 2
    return main(modes, args.steps, args.timeout, args.json)
