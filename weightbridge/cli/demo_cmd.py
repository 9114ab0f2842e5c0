"""``weightbridge demo``: run a trainer world and a rollout world on CPU/Gloo, verify every update bitwise."""

from __future__ import annotations

import argparse

from weightbridge.cli.common import excerpt, positive_float, positive_int

MAX_TIMEOUT_S = 24 * 3600.0


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ("sync", "async")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"takes sync and/or async, comma-separated (got {excerpt(repr(text), 60)})")
    return modes


def _timeout(text: str) -> float:
    value = positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TIMEOUT_S:.0f} s, got {excerpt(text, 40)}")
    return value


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
    p.add_argument("--modes", type=_modes, default=("sync", "async"),
                   help="comma-separated modes, in order (default: sync,async)")
    p.add_argument("--steps", type=positive_int, default=3,
                   help="optimizer steps (= versions) per mode (default: %(default)s)")
    p.add_argument("--timeout", type=_timeout, default=120.0, help="hard wall-clock limit, s (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (with \"verified\": true|false)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from weightbridge.demo.run import main

    return main(args.modes, args.steps, args.timeout, args.json)
