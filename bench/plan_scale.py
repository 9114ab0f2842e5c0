"""Planner scale benchmark: planning seconds, peak memory and plan quality per example.

    python bench/plan_scale.py                 # every spec/examples/*.yaml + synthetic DeepSeek-V3
    python bench/plan_scale.py --only deepseek --repeat 5
    python bench/plan_scale.py --json
    python bench/plan_scale.py --ranks         # per-rank planning vs world size, synthetic DeepSeek-V3 up to 4096 ranks

Pinned to one CPU core. ``planning`` is the best of ``--repeat`` runs of ``build_plan`` in wall
seconds (median in brackets) and in CPU seconds of this process (``time.process_time``, which
is what counts when other processes share the core); resolving the spec is not counted.
``peak MiB`` is the tracemalloc peak of one extra ``build_plan`` run (memory the planner
allocates, not the layouts it is given).

``--ranks``: synthetic DeepSeek-V3 (Megatron PP16 x EP16 x DP ``d`` -> ``16 d`` vLLM TP8 instances)
for ``d`` = 1, 2, 4, 8, 16 (256 -> 128 up to 4096 -> 2048 ranks). Per world size: ``build_rank_plan``
of the first and last rank of each side (best of ``--repeat`` CPU seconds each; the slowest is
reported, with its tracemalloc peak), and the global ``build_plan`` where the world is at most
``--global-upto`` ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from weightbridge.plan import build_plan, build_rank_plan, network_model, plan_metrics, validate_plan  # noqa: E402
from weightbridge.plan.render import balance_reason  # noqa: E402


def _cases(only: str | None, synthetic: bool):
    try:
        from weightbridge.spec.resolve import resolve_spec
    except ImportError:  # the spec layer is not there yet
        resolve_spec = None
    if resolve_spec is not None:
        for path in sorted((ROOT / "spec" / "examples").glob("*.yaml")):
            if only and only not in path.name:
                continue

            def load(path=path):
                r = resolve_spec(path)
                return (r.trainer, r.rollout, r.sync.round_bytes, r.network, r.sync.mode, r.sync.max_staleness,
                        r.canonical)

            yield path.stem, load
    if synthetic and (not only or only in "synthetic-deepseek-v3"):
        from weightbridge.testing._internal.synthetic_layouts import moe_layouts

        def load_syn():
            tr, ro = moe_layouts(share_instances=False)
            return tr, ro, 2 << 30, "h200", "sync", 1, None

        yield "synthetic-deepseek-v3", load_syn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="substring of the example name")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--no-validate", action="store_true", help="skip validate_plan (slow at DeepSeek scale)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the first allowed)")
    ap.add_argument("--ranks", action="store_true", help="per-rank planning vs world size (synthetic DeepSeek-V3)")
    ap.add_argument("--global-upto", type=int, default=1536, help="with --ranks: also time build_plan up to this world")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {args.cpu if args.cpu is not None else cpus[0]})
    if args.ranks:
        return _rank_scaling(args)

    rows = []
    for name, load in _cases(args.only, not args.no_synthetic):
        t0 = time.perf_counter()
        trainer, rollout, round_bytes, network, mode, staleness, canonical = load()
        load_s = time.perf_counter() - t0
        net = network_model(network, colocated=mode == "colocated")
        times, cpu = [], []
        plan = None
        for _ in range(max(1, args.repeat)):
            c0, w0 = time.process_time(), time.perf_counter()
            plan = build_plan(trainer, rollout, round_bytes=round_bytes, network=net)
            times.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        tracemalloc.start()
        build_plan(trainer, rollout, round_bytes=round_bytes, network=net)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        problems = [] if args.no_validate else validate_plan(plan, trainer, rollout, canonical=canonical)
        m = plan_metrics(plan, trainer, rollout, network=net, sync_mode=mode, max_staleness=staleness,
                         problems=problems, planning_seconds=min(times))
        npieces = sum(len(t.pieces) for side in (trainer, rollout) for lay in side.ranks for t in lay.tensors)
        row = {
            "example": name,
            "senders": trainer.world_size,
            "receivers": rollout.world_size,
            "pieces": npieces,
            "items": m["num_items"],
            "rounds": m["num_rounds"],
            "load_seconds": load_s,
            "planning_seconds": min(times),
            "planning_seconds_median": statistics.median(times),
            "planning_cpu_seconds": min(cpu),
            "peak_mib": peak / 2**20,
            "wire_over_min": m["wire_bytes"] / m["min_wire_bytes"] if m["min_wire_bytes"] else 1.0,
            "sender_balance": m["sender_balance"],
            "sender_balance_bound": m["sender_balance_bound"],
            "predicted_over_bound": (m["predicted_seconds"] / m["lower_bound_seconds"]
                                     if m["lower_bound_seconds"] else float("inf")),
            "predicted_seconds": m["predicted_seconds"],
            "lower_bound_seconds": m["lower_bound_seconds"],
            "baseline_seconds": m["baseline_seconds"],
            "stall_seconds": m["stall_seconds"],
            "baseline_stall_seconds": m["baseline_stall_seconds"],
            "baseline_stall_over_stall": (m["baseline_stall_seconds"] / m["stall_seconds"]
                                          if m["stall_seconds"] else float("inf")),
            "sync_mode": mode,
            "receiver_dedup": m["receiver_dedup"],
            "problems": len(problems),
            "balance_note": balance_reason(m),
        }
        rows.append(row)
        if not args.json:
            _print_row(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def _print_row(r: dict) -> None:
    print(f"{r['example']}")
    print(f"  {r['senders']} senders -> {r['receivers']} receivers, {r['pieces']} pieces, {r['items']} items, "
          f"{r['rounds']} rounds (spec load {r['load_seconds']:.2f} s, not counted)")
    print(f"  planning {r['planning_seconds']:.3f} s wall (median {r['planning_seconds_median']:.3f} s), "
          f"{r['planning_cpu_seconds']:.3f} s CPU, peak {r['peak_mib']:.0f} MiB")
    print(f"  wire/min {r['wire_over_min']:.3f}  sender balance {r['sender_balance']:.3f} "
          f"(layouts allow {r['sender_balance_bound']:.3f})  receiver dedup {r['receiver_dedup']}  "
          f"problems {r['problems']}")
    print(f"  predicted {r['predicted_seconds']:.4g} s / lower bound {r['lower_bound_seconds']:.4g} s = "
          f"{r['predicted_over_bound']:.3f}   baseline {r['baseline_seconds']:.4g} s")
    print(f"  stall ({r['sync_mode']}) {r['stall_seconds']:.4g} s vs baseline {r['baseline_stall_seconds']:.4g} s = "
          f"{r['baseline_stall_over_stall']:.1f}x")
    if r["balance_note"]:
        print(f"  note: {r['balance_note']}")
    sys.stdout.flush()


def _rank_scaling(args) -> int:
    from weightbridge.testing._internal.synthetic_layouts import moe_layouts

    net = network_model("h200")
    rows = []
    if not args.json:
        print(f"{'trainer -> rollout':>20} {'global build_plan':>18} {'slowest rank':>14} {'CPU s':>6} {'wall s':>7} "
              f"{'peak MiB':>8} {'its buckets':>11}")
    for dp in (1, 2, 4, 8, 16):
        tr, ro = moe_layouts(dp=dp, instances=16 * dp, share_instances=True)
        world = tr.world_size + ro.world_size
        glob = None
        if world <= args.global_upto:
            w0 = time.perf_counter()
            build_plan(tr, ro, round_bytes=2 << 30, network=net)
            glob = time.perf_counter() - w0
        per = []
        for side, lay in (("trainer", tr), ("rollout", ro)):
            for rank in (0, lay.world_size - 1):
                best = None
                for _ in range(max(1, args.repeat)):
                    c0, w0 = time.process_time(), time.perf_counter()
                    rp = build_rank_plan(tr, ro, side=side, rank=rank, round_bytes=2 << 30, network=net)
                    t = (time.process_time() - c0, time.perf_counter() - w0)
                    best = t if best is None or t < best else best
                per.append((best, side, rank, sum(1 for _ in rp.buckets())))
        (cpu, wall), side, rank, nb = max(per)
        tracemalloc.start()
        build_rank_plan(tr, ro, side=side, rank=rank, round_bytes=2 << 30, network=net)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row = {"senders": tr.world_size, "receivers": ro.world_size, "global_seconds": glob,
               "slowest_rank": f"{side} {rank}", "rank_cpu_seconds": cpu, "rank_wall_seconds": wall,
               "rank_peak_mib": peak / 2**20, "rank_buckets": nb,
               "ranks_cpu_seconds": {f"{s_} {r_}": c for (c, _), s_, r_, _ in per}}
        rows.append(row)
        if not args.json:
            g = f"{glob:.2f} s" if glob is not None else "not run"
            print(f"{tr.world_size:>9} -> {ro.world_size:<8} {g:>18} {row['slowest_rank']:>14} {cpu:>6.2f} "
                  f"{wall:>7.2f} {row['rank_peak_mib']:>8.0f} {nb:>11}")
            sys.stdout.flush()
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
