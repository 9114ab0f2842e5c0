#!/usr/bin/env python
"""Benchmark: weightbridge vs the slime-style gather-convert-broadcast vs a raw P2P bound, one Megatron world.

In ONE run per layout: 2 Megatron-Core trainer ranks (Gloo, local layer spec, fp32; dense at TP 2
or MoE at EP 2 x DP 2) and 2 rollout ranks holding vLLM TP 2 layouts (stand-ins: live tensors in
the ``vllm`` preset's layout, no engine; the transfer is what is measured). Per repetition, with a
barrier of all 4 processes between phases so timings never overlap:

(a) **weightbridge sync**: every trainer rank ``TrainerBridge.push(v)`` of its own shards; rollout
    ranks ``poll``/``apply``. Trainer stall = the push call; end to end = barrier to barrier.
(b) **weightbridge async**: the same with ``sync.mode: async`` (staged on a receive thread);
    trainer stall = the push call.
(c) **slime-style baseline** (``update_weight_utils``: per parameter, all-gather the shards that
    differ across ranks (TP shards, EP experts) over the trainer world, convert to HF names and
    layouts on trainer rank 0 through the introspected IR, broadcast every full HF tensor from
    trainer rank 0 to every rollout rank over a Gloo group {trainer 0, rollouts}; rollouts then
    hold full tensors, as vLLM's ``load_weights`` wants). Trainer stall = the whole thing (the
    trainer cannot step while it gathers and broadcasts, in sync and async RL alike).
(d) **raw P2P bound**: each rollout rank receives exactly its own bytes (its layout's elements), half
    from each trainer rank, as one contiguous send per (trainer, rollout) pair: no packing, no
    plan, no control plane.

Prints medians and the ratios baseline / weightbridge and weightbridge / raw.

    python bench/megatron_update.py                 # both layouts, 3 repetitions
    python bench/megatron_update.py --layouts dense-tp2 --reps 5 --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAYOUTS = {  # name: (model kind, HF overrides, Megatron mesh)
    "dense-tp2": ("qwen2", {"num_key_value_heads": 2, "hidden_size": 512, "intermediate_size": 1536,
                            "num_attention_heads": 8, "num_hidden_layers": 4, "max_window_layers": 4,
                            "vocab_size": 8000, "tie_word_embeddings": False}, {"tp": 2}),
    "moe-ep2": ("qwen3-moe", {"hidden_size": 256, "moe_intermediate_size": 256, "num_hidden_layers": 4,
                              "max_window_layers": 4, "vocab_size": 8000}, {"ep": 2, "dp": 2}),
}


def _spec(directory: Path, mesh: dict[str, int], mode: str) -> Path:
    import yaml

    spec = {"version": 1, "model": {"config": str((directory / "config.json").resolve())},
            "trainer": {"preset": "megatron", "mesh": mesh, "params": {"local_spec": True, "moe_grouped_gemm": False}},
            "rollout": {"preset": "vllm", "mesh": {"tp": 2}},
            "sync": {"mode": mode, "max_staleness": 1, "transport": "gloo", "timeout_s": 120, "heartbeat_s": 0.5}}
    path = directory / f"spec_{mode}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _pg(store: Any, prefix: str, rank: int, size: int) -> Any:
    import torch.distributed as dist

    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=120)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, opts)


def bench_rank(job: dict[str, Any]) -> dict[str, Any]:
    """One process: index 0-1 trainer ranks, 2-3 rollout ranks (launched by name)."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig

    from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
    from weightbridge.tensors import empty_like_layout
    from weightbridge.transport.store import open_store

    i, reps = job["index"], job["reps"]
    store = open_store("127.0.0.1", job["port"], is_master=False, timeout_s=120)
    allpg = _pg(store, "bench/all/", i, 4)
    bpg = _pg(store, "bench/bcast/", 0 if i == 0 else i - 1, 3) if i != 1 else None
    specs = {m: load_spec(job[f"spec_{m}"]) for m in ("sync", "async")}
    res = specs["sync"]
    canon = {t.name: t.shape for t in res.canonical}
    barrier = lambda: allpg.barrier().wait()  # noqa: E731
    out: dict[str, list[float]] = {}
    trainer = i < 2
    if trainer:
        from weightbridge.integrations.megatron.cpu_trainer import MegatronWorld

        mesh = job["mesh"]
        world = MegatronWorld(AutoConfig.from_pretrained(job["dir"]), rank=i, world_size=2, tp=mesh.get("tp", 1),
                              ep=mesh.get("ep", 1), store=store, prefix="bench/trainer-world/")
        tensors = world.tensors()
        irs: list[Any] = [None, None]
        dist.all_gather_object(irs, [(t.name, t.pieces) for t in world.layout.tensors])  # setup, not timed
        gather = {name: dict(irs[0])[name] != dict(irs[1])[name] for name, _ in irs[0]}
    else:
        r = i - 2
        live = empty_like_layout(res.rollout.ranks[r])
    own = [sum(p.numel for _, p in res.rollout.ranks[r].pieces()) for r in range(2)]

    def timed(key: str, fn: Any) -> None:
        barrier()
        t0 = time.perf_counter()
        stall = fn()
        barrier()
        out.setdefault(key + "_e2e_s", []).append(time.perf_counter() - t0)
        if stall is not None:
            out.setdefault(key + "_stall_s", []).append(stall)

    for mode in ("sync", "async"):
        opts = BridgeOptions(prefix=f"bench-{mode}")
        if trainer:
            bridge = TrainerBridge.from_spec(specs[mode], rank=i, tensors=tensors, store=store, options=opts)
        else:
            bridge = RolloutBridge.from_spec(specs[mode], rank=r, tensors=live, store=store, options=opts)
        for v in range(1, reps + 2):  # the first version warms up (plan, buffers) and is dropped

            def step() -> float | None:
                if trainer:
                    t0 = time.perf_counter()
                    bridge.push(v, tensors=tensors)
                    return time.perf_counter() - t0
                deadline = time.monotonic() + 120
                while not bridge.poll():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"rollout {r}: version {v} never ready")
                    time.sleep(0.0005)
                bridge.apply()
                return None

            timed(f"wb_{mode}" if v > 1 else "warmup", step)
        bridge.close()

    def baseline() -> float | None:
        t0 = time.perf_counter()
        if trainer:
            full = {n: torch.empty(s) for n, s in canon.items()} if i == 0 else {}
            for name, t in tensors.items():
                shards = [torch.empty_like(t) for _ in range(2)] if gather[name] else None
                if shards is not None:
                    dist.all_gather(shards, t.detach())
                if i == 0:  # convert: every source rank's shard through its IR into HF tensors
                    for src, held in enumerate(shards or [t.detach()]):
                        for p in dict(irs[src])[name]:
                            sl = tuple(slice(a, b) for a, b in p.canonical_box)
                            full[p.canonical][sl] = held[tuple(slice(a, b) for a, b in p.local_box)].reshape(
                                full[p.canonical][sl].shape)
            if i == 0:
                for n in sorted(full):
                    bpg.broadcast([full[n]], dist.BroadcastOptions()).wait()
            return time.perf_counter() - t0
        for n in sorted(canon):
            bpg.broadcast([torch.empty(canon[n])], dist.BroadcastOptions()).wait()
        return None

    def raw() -> None:
        if trainer:
            bufs = [torch.empty(own[k] // 2 + (own[k] % 2) * (1 - i)) for k in range(2)]
            works = [allpg.send([bufs[k]], 2 + k, 0) for k in range(2)]
        else:
            bufs = [torch.empty(own[r] // 2 + (own[r] % 2) * (1 - src)) for src in range(2)]
            works = [allpg.recv([bufs[src]], src, 0) for src in range(2)]
        for w in works:
            w.wait()

    for rep in range(reps + 1):
        timed("baseline" if rep else "warmup", baseline)
        timed("raw" if rep else "warmup", raw)
    if trainer:
        world.close()
    out["bytes_per_rollout"] = [4.0 * n for n in own]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from weightbridge.localrun import launch
    from weightbridge.testing._internal.vllm_selfcheck import hf_config
    from weightbridge.transport.store import open_store

    report = {}
    for name in args.layouts:
        kind, overrides, mesh = LAYOUTS[name]
        d = Path(tempfile.mkdtemp(prefix=f"wb-bench-megatron-{name}-"))
        hf_config(kind, **overrides).save_pretrained(d)
        master = open_store("127.0.0.1", 0, is_master=True, timeout_s=120)
        job = {"port": master.port, "dir": str(d), "mesh": mesh, "reps": args.reps,
               "spec_sync": str(_spec(d, mesh, "sync")), "spec_async": str(_spec(d, mesh, "async"))}
        results = launch(bench_rank, [({**job, "index": k},) for k in range(4)], timeout_s=900,
                         preload=("megatron.core", "weightbridge.integrations.megatron.cpu_trainer"))
        bad = [r for r in results if not r.ok]
        if bad:
            print(f"{name}: rank {bad[0].index} failed: {bad[0].error}\n{bad[0].traceback}", file=sys.stderr)
            return 1
        t0 = results[0].value
        med = {k: statistics.median(v) for k, v in t0.items() if k != "bytes_per_rollout"}
        med["mb_per_rollout"] = t0["bytes_per_rollout"][0] / 2**20
        med["baseline_over_wb"] = med["baseline_e2e_s"] / med["wb_sync_e2e_s"]
        med["wb_over_raw"] = med["wb_sync_e2e_s"] / med["raw_e2e_s"]
        report[name] = med
        if not args.json:
            print(f"{name}: {med['mb_per_rollout']:.1f} MiB per rollout rank | end to end: weightbridge sync "
                  f"{med['wb_sync_e2e_s'] * 1e3:.1f} ms, async {med['wb_async_e2e_s'] * 1e3:.1f} ms, slime-style "
                  f"{med['baseline_e2e_s'] * 1e3:.1f} ms, raw P2P {med['raw_e2e_s'] * 1e3:.1f} ms | baseline/wb "
                  f"{med['baseline_over_wb']:.2f}x, wb/raw {med['wb_over_raw']:.2f}x | trainer stall: wb sync "
                  f"{med['wb_sync_stall_s'] * 1e3:.1f} ms, wb async {med['wb_async_stall_s'] * 1e3:.1f} ms, "
                  f"baseline {med['baseline_stall_s'] * 1e3:.1f} ms (sync and async alike)", flush=True)
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
