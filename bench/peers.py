#!/usr/bin/env python
"""What weightbridge's plan predicts for the configurations peers publish update times for.

For each published configuration: the same model, the two sides' layouts (as close to the
published setup as the report says; assumptions in the table's ``layouts`` column) and the
hardware as a network preset. Printed per row: the planned wire bytes, the busiest rank's bytes,
the lower bound (busiest link / its bandwidth), weightbridge's predicted time and the
gather-then-broadcast baseline on the same network, next to the time the peer reported.

FP8 rows (``FP8``): the same layouts with the rollout serving the decoder layers' linear weights
as FP8 with 128x128 block scales, quantised at the trainer ranks (``rollout.quantization``):
what moves is FP8 values plus fp32 scales (about 50% of their bf16 bytes).

**Predictions, not measurements**: the cost model's formulas and preset link rates are in
``docs/planner.md``; nothing here moved a byte. The peers' numbers are as published (sources in
the table), on their hardware and software, and include what they include (some time engine
pauses or resharding, some only the transfer).

    python bench/peers.py            # every row (resolving the 1T-parameter specs takes a while)
    python bench/peers.py --only kimi
    python bench/peers.py --only fp8
    python bench/peers.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weightbridge.plan import build_plan, network_model, plan_metrics  # noqa: E402
from weightbridge.spec.resolve import check_text  # noqa: E402


@dataclass(frozen=True)
class Peer:
    name: str
    reported_s: tuple[float, float]  # as published (a range where they give one)
    source: str
    layouts: str  # what we assumed, in words
    spec: str


FP8 = "  quantization: {block: [128, 128], at: sender}\n"

PEERS = [
    Peer(
        "NCCL M2N (DeepSeek-V3, GB200)", (1.45, 1.45), "NVIDIA NCCL M2N weight-update blog: 128 train -> 128 gen GPUs",
        "train Megatron PP4 x EP16 (dense DP32, expert DP2), 128 GPUs -> 16 vLLM instances of TP8, 128 GPUs",
        """
model: {bundled: deepseek-v3}
trainer: {preset: megatron, mesh: {pp: 4, dp: 32, ep: 16, etp: 1}, pipeline: {layers: [16, 15, 15, 15]}}
rollout: {preset: vllm, instances: 16, mesh: {tp: 8}}
network: gb200
""",
    ),
    Peer(
        "NeMo-RL (DeepSeek-V3, H100)", (2.39, 2.83), "NeMo-RL refit measurements: PP16 x EP16 -> TP32 x DP8",
        "train Megatron PP16 x EP16 (dense DP16), 256 GPUs -> 8 vLLM instances of TP32, 256 GPUs",
        """
model: {bundled: deepseek-v3}
trainer:
  preset: megatron
  mesh: {pp: 16, dp: 16, ep: 16, etp: 1}
  pipeline: {layers: [3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2]}
rollout: {preset: vllm, instances: 8, mesh: {tp: 32}}
network: h100
""",
    ),
    Peer(
        "miles (Qwen3-235B-A22B, H100)", (3.16, 3.16), "miles (radixark) weight-sync report: 8 train + 8 rollout nodes",
        "train Megatron TP4 x PP4 x DP4, EP8 (64 GPUs) -> 8 SGLang/vLLM instances of TP8 EP8 (64 GPUs)",
        """
model: {bundled: qwen3-235b-a22b}
trainer: {preset: megatron, mesh: {tp: 4, pp: 4, dp: 4, ep: 8, etp: 1}, pipeline: {layers: [24, 24, 23, 23]}}
rollout: {preset: vllm, instances: 8, mesh: {tp: 8, ep: 8}}
network: h100
""",
    ),
    Peer(
        "miles (Kimi-K2, H100)", (7.23, 7.23), "miles (radixark) weight-sync report: 32 train + 32 rollout nodes",
        "train Megatron PP8 x EP32 (dense DP32), 256 GPUs -> 16 vLLM instances of TP16 EP16, 256 GPUs",
        """
model: {bundled: kimi-k2}
trainer: {preset: megatron, mesh: {pp: 8, dp: 32, ep: 32, etp: 1}, pipeline: {layers: [8, 8, 8, 8, 8, 7, 7, 7]}}
rollout: {preset: vllm, instances: 16, mesh: {tp: 16, ep: 16}}
network: h100
""",
    ),
    Peer(
        "NCCL M2N FP8 (DeepSeek-V3, GB200)", (1.45, 1.45),
        "NVIDIA NCCL M2N weight-update blog (moves the checkpoint's FP8 dtypes): 128 train -> 128 gen GPUs",
        "as the NCCL M2N row, the rollout serving 128x128 block FP8 quantised at the trainer ranks",
        """
model: {bundled: deepseek-v3}
trainer: {preset: megatron, mesh: {pp: 4, dp: 32, ep: 16, etp: 1}, pipeline: {layers: [16, 15, 15, 15]}}
rollout:
  preset: vllm
  instances: 16
  mesh: {tp: 8}
""" + FP8 + """network: gb200
""",
    ),
    Peer(
        "Perplexity FP8 (Kimi-K2, H100)", (1.3, 1.3),
        "Perplexity weight-transfer report: bf16 trainer -> FP8 inference, 256 train -> 128 gen GPUs, quantised "
        "before the wire",
        "train Megatron PP8 x EP32 (dense DP32), 256 GPUs -> 16 vLLM instances of TP8 EP8, 128 GPUs, 128x128 block "
        "FP8 quantised at the trainer ranks; their GPUs and fabric assumed H100-class",
        """
model: {bundled: kimi-k2}
trainer: {preset: megatron, mesh: {pp: 8, dp: 32, ep: 32, etp: 1}, pipeline: {layers: [8, 8, 8, 8, 8, 7, 7, 7]}}
rollout:
  preset: vllm
  instances: 16
  mesh: {tp: 8, ep: 8}
""" + FP8 + """network: h100
""",
    ),
]


def predict(peer: Peer, round_bytes: int) -> dict:
    t0 = time.perf_counter()
    r, problems = check_text("version: 1\n" + peer.spec + f"sync: {{round_bytes: {round_bytes}}}\n")
    if r is None:
        raise SystemExit(f"{peer.name}: the spec does not resolve:\n" + "\n".join(str(p) for p in problems))
    resolve_s = time.perf_counter() - t0
    net = network_model(r.network)
    t1 = time.perf_counter()
    plan = build_plan(r.trainer, r.rollout, round_bytes=round_bytes, network=net)
    plan_s = time.perf_counter() - t1
    m = plan_metrics(plan, r.trainer, r.rollout, network=net, sync_mode="sync", max_staleness=0)
    busiest = max([*plan.sender_bytes().values(), *plan.receiver_bytes().values()], default=0)
    return {
        "peer": peer.name, "source": peer.source, "layouts": peer.layouts, "network": net.name,
        "trainer_ranks": r.trainer.world_size, "rollout_ranks": r.rollout.world_size,
        "model_bytes": r.canonical.total_bytes(), "wire_bytes": plan.wire_bytes,
        "busiest_rank_bytes": busiest, "receiver_dedup": plan.receiver_dedup, "rounds": plan.num_rounds,
        "lower_bound_s": m["lower_bound_seconds"], "predicted_s": m["predicted_seconds"],
        "baseline_s": m["baseline_seconds"], "reported_s": list(peer.reported_s),
        "wire_bytes_by_dtype": m["wire_bytes_by_dtype"], "fp8_wire_ratio": m["fp8_wire_ratio"],
        "resolve_s": resolve_s, "plan_s": plan_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="substring of the peer's name (case-insensitive)")
    ap.add_argument("--round-gib", type=float, default=2.0, help="sync.round_bytes of every plan (GiB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for peer in PEERS:
        if args.only and args.only.lower() not in peer.name.lower():
            continue
        print(f"[peers] {peer.name}: resolving and planning ...", file=sys.stderr, flush=True)
        row = predict(peer, int(args.round_gib * (1 << 30)))
        print(f"[peers]   resolved in {row['resolve_s']:.1f} s, planned in {row['plan_s']:.1f} s", file=sys.stderr,
              flush=True)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    gb = 1e9
    print("PREDICTIONS of weightbridge's cost model (docs/planner.md), next to what peers reported:")
    print(f"{'configuration':<32}{'ranks':>10}{'model GB':>9}{'wire GB':>9}{'busiest GB':>11}"
          f"{'bound s':>9}{'predicted s':>12}{'gather+bcast s':>15}{'reported s':>12}")
    for x in rows:
        lo, hi = x["reported_s"]
        rep = f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"
        print(f"{x['peer']:<32}{x['trainer_ranks']:>4} ->{x['rollout_ranks']:>4}{x['model_bytes'] / gb:>9.0f}"
              f"{x['wire_bytes'] / gb:>9.0f}{x['busiest_rank_bytes'] / gb:>11.2f}{x['lower_bound_s']:>9.3f}"
              f"{x['predicted_s']:>12.3f}{x['baseline_s']:>15.2f}{rep:>12}")
    for x in rows:
        if x["fp8_wire_ratio"] is not None:
            print(f"  {x['peer']}: wire / unquantised = {x['fp8_wire_ratio']:.4f} ("
                  + ", ".join(f"{d} {n / gb:.1f} GB" for d, n in x["wire_bytes_by_dtype"].items()) + ")")
    print("\nlayouts assumed (network preset in brackets):")
    for x in rows:
        print(f"  {x['peer']}: {x['layouts']} [{x['network']}]; receiver de-replication {x['receiver_dedup']}, "
              f"{x['rounds']} rounds. Reported: {x['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
