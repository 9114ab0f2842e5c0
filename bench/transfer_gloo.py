#!/usr/bin/env python
"""Benchmark: weightbridge vs gather-then-broadcast vs a raw P2P bound, on CPU/Gloo.

In ONE run, on the same processes and the same weights (a Qwen2-style model built from a
generated HF config, bf16), a trainer of ``--trainer-tp`` ranks (Megatron TP) updates
``--instances`` rollout instances of vLLM TP ``--rollout-tp``. Three methods, timed between
barriers (best of ``--iters``), every rollout tensor verified bitwise after each method:

(a) **weightbridge**: :class:`weightbridge.transport.Executor` on the plan (chunked P2P rounds,
    double-buffered pack/unpack, straight into the destination tensors);
(b) **gather-then-broadcast** (what most RL frameworks do): per canonical tensor, the trainer
    ranks all-gather their shards, trainer rank 0 assembles the full tensor and broadcasts it
    to every rollout rank (one group: trainer rank 0 + all rollout ranks), each rollout rank
    slices its part into its local tensors;
(c) **raw P2P bound**: every (sender, receiver) pair of the plan moves exactly its bytes as one
    pre-packed buffer, all in one batch (no packing, no unpacking, no rounds).

Prints the three times, the ratios b/a and a/c, the bytes each method moved, and the cost of
``sync.checksums`` (on by default): (a) inline with and without checksums, alternating, as a ratio.
(a) inline and (c) also alternate run by run (best of ``--iters`` each), so a/c compares runs from
the same stretch of time on this shared machine; (a) uses the library's chunk size (64 MiB).

    python bench/transfer_gloo.py                   # ~230 MB bf16 model, 2 -> 2 x 2 ranks
    python bench/transfer_gloo.py --layers 4 --json # smaller, JSON out
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from weightbridge.plan import build_plan, network_model
from weightbridge.plan.cost import price
from weightbridge.spec.resolve import check_text
from weightbridge.transport import Executor, create_bridge_group, open_store
from weightbridge.tensors import (
    canonical_tensors,
    diff_tensors,
    empty_like_layout,
    materialize,
    needed_names,
)
from weightbridge.localrun import launch
from weightbridge.testing._internal.bench_models import qwen2_config
from weightbridge.testing._internal.gather_broadcast import GatherBroadcast

FILL = 3.0


def spec_text(config_path: str, args: argparse.Namespace) -> str:
    return f"""
version: 1
model: {{config: {json.dumps(config_path)}}}
trainer: {{preset: megatron, mesh: {{tp: {args.trainer_tp}}}}}
rollout: {{preset: vllm, instances: {args.instances}, mesh: {{tp: {args.rollout_tp}}}}}
sync: {{round_bytes: {args.round_mib}MiB}}
network: cpu-gloo
"""


def _barrier(pg) -> None:
    pg.allreduce([torch.zeros(1)]).wait()


def _pg(store, prefix: str, rank: int, size: int, timeout_s: float):
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, datetime.timedelta(seconds=timeout_s))


def worker(cfg: dict) -> dict:
    r, problems = check_text(cfg["spec"])
    assert r is not None, problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=cfg["round_bytes"], receiver_dedup=cfg["receiver_dedup"],
                      network=network_model(r.network))
    assert plan.plan_hash == cfg["plan_hash"]
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    me = rank if side == "trainer" else S + rank
    timeout_s = cfg["timeout_s"]
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=timeout_s)
    group = create_bridge_group(store, rank=me, world_size=S + R, num_trainers=S, backend="gloo", timeout_s=timeout_s)
    pg = group.pg
    tgroup = _pg(store, "bench/trainers/", rank, S, timeout_s) if side == "trainer" else None
    in_bcast = side == "rollout" or rank == 0
    bgroup = _pg(store, "bench/bcast/", 0 if side == "trainer" else 1 + rank, 1 + R, timeout_s) if in_bcast else None

    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    canon = canonical_tensors(r.canonical, seed=1, names=needed_names(layout))
    if side == "trainer":
        local = materialize(layout, canon)
        want = None
    else:
        local = empty_like_layout(layout, fill=FILL)
        want = materialize(layout, canon, fill=FILL)
    del canon
    out: dict = {"side": side, "rank": rank, "times": {}, "verified": {}, "bytes": {}}

    def reset() -> None:
        if side == "rollout":
            for t in local.values():
                t.fill_(FILL)

    def once(name: str, fn) -> float:
        reset()
        _barrier(pg)
        t0 = time.perf_counter()
        nbytes = fn()
        _barrier(pg)
        dt = time.perf_counter() - t0
        if side == "rollout" and name != "raw":
            bad = diff_tensors(local, want)
            out["verified"][name] = out["verified"].get(name, True) and not bad
        out["times"][name] = min(out["times"].get(name, dt), dt)
        out["bytes"][name] = nbytes
        return dt

    def timed(name: str, fn) -> None:
        for _ in range(cfg["iters"]):
            once(name, fn)

    def alternating(runs: dict) -> None:
        """Each of ``runs`` once per iteration, the order reversed every other iteration, so that the
        machine's noise (6 processes on 2 shared cores) hits them alike: their ratio is read from one
        stretch of time, not from runs a minute apart."""
        names = list(runs)
        for it in range(cfg["iters"]):
            for name in (names if it % 2 == 0 else names[::-1]):
                once(name, runs[name])

    # (c) raw P2P bound: one pre-packed buffer per (sender, receiver) pair, all in one batch.
    pair_bytes: dict = {}
    for _, b in plan.buckets():
        src = b.sender if b.src_side == "trainer" else S + b.sender
        key = (src, S + b.receiver)
        pair_bytes[key] = pair_bytes.get(key, 0) + b.nbytes
    sends = {dst: torch.ones(n, dtype=torch.uint8) for (src, dst), n in pair_bytes.items() if src == me}
    recvs = {src: torch.empty(n, dtype=torch.uint8) for (src, dst), n in pair_bytes.items() if dst == me}

    def raw() -> int:
        works = [pg.send([t], dst, 0) for dst, t in sends.items()] + [pg.recv([t], src, 0) for src, t in recvs.items()]
        for w in works:
            w.wait(datetime.timedelta(seconds=timeout_s))
        return sum(t.numel() for t in recvs.values())

    # (a) weightbridge: inline (the default) alternating with (c), then thread and off; then inline
    # with and without checksums (sync.checksums, the default: CRC-32 per bucket on CPU wire
    # buffers), alternating too.
    def executor(overlap: str, checksums: bool = False) -> Executor:
        return Executor(plan, group, side=side, rank=rank, device=torch.device("cpu"), chunk_bytes=cfg["chunk_bytes"],
                        overlap=overlap, checksums=checksums, **cfg["direct"])

    def run_wb(ex: Executor) -> int:
        st = ex.run(local)
        out.setdefault("wb_stats", {})[ex.overlap] = st.to_json()
        return st.bytes_received  # per rank; summed by the parent

    ex = executor("inline")
    alternating({"weightbridge_inline": lambda: run_wb(ex), "raw": raw})
    ex.release_buffers()
    for overlap in ("thread", "off"):
        ex = executor(overlap)
        timed(f"weightbridge_{overlap}", lambda ex=ex: run_wb(ex))
        ex.release_buffers()
    pair = {ck: executor("inline", ck) for ck in (False, True)}
    alternating({f"checksums_{'on' if ck else 'off'}": (lambda ck=ck: pair[ck].run(local).bytes_received)
                 for ck in (False, True)})
    for ex in pair.values():
        ex.release_buffers()

    # (b) gather-then-broadcast.
    gather_broadcast = GatherBroadcast(r, side, rank, local, tgroup, bgroup).run
    timed("gather_broadcast", gather_broadcast)

    _barrier(pg)
    group.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--trainer-tp", type=int, default=2)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--rollout-tp", type=int, default=2)
    ap.add_argument("--round-mib", type=int, default=1024,
                    help="sync.round_bytes in MiB (default: the spec's default, 1 GiB; 64 plans this model in 5 rounds)")
    ap.add_argument("--chunk-mib", type=int, default=64, help="P2P chunk size (default: the Executor's, 64 MiB)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--direct-kib", type=int, default=None,
                    help="items of at least this size move as messages of their own (default: the library's)")
    ap.add_argument("--receiver-dedup", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    cfg_path = tmp / "config.json"
    cfg_path.write_text(json.dumps(qwen2_config(args.hidden, args.layers, args.vocab, args.intermediate, args.heads, args.kv_heads)))
    text = spec_text(str(cfg_path), args)
    r, problems = check_text(text)
    if r is None:
        print("\n".join(str(p) for p in problems), file=sys.stderr)
        return 2
    round_bytes = args.round_mib << 20
    net = network_model(r.network)
    plan = build_plan(r.trainer, r.rollout, round_bytes=round_bytes, receiver_dedup=args.receiver_dedup, network=net)
    predicted_s, bound_s = price(plan, net)
    S, R = r.trainer.world_size, r.rollout.world_size
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    base = {"spec": text, "round_bytes": round_bytes, "plan_hash": plan.plan_hash, "port": store.port,
            "timeout_s": args.timeout, "receiver_dedup": args.receiver_dedup, "iters": args.iters, "chunk_bytes": args.chunk_mib << 20,
            "direct": {} if args.direct_kib is None else {"direct_bytes": args.direct_kib << 10}}
    cfgs = [({**base, "side": "trainer", "rank": t},) for t in range(S)]
    cfgs += [({**base, "side": "rollout", "rank": q},) for q in range(R)]
    t0 = time.monotonic()
    results = launch(worker, cfgs, timeout_s=args.timeout * 4)
    if not all(res.ok for res in results):  # every rank's outcome first, then the first failure
        for res in results:
            why = "ok" if res.ok else (f"FAILED: {type(res.error).__name__}: {res.error}" if res.error is not None
                                       else f"FAILED: died (exit {res.exitcode}, timed out {res.timed_out})")
            print(f"rank process {res.index} ({cfgs[res.index][0]['side']} {cfgs[res.index][0]['rank']}): {why}",
                  file=sys.stderr)
    outs = [res.unwrap() for res in results]
    wall = time.monotonic() - t0

    def t(name: str) -> float:
        return max(o["times"][name] for o in outs)

    rollouts = [o for o in outs if o["side"] == "rollout"]
    modes = ("inline", "thread", "off")
    moved = {
        "weightbridge": sum(o["bytes"]["weightbridge_inline"] for o in rollouts),
        "gather_broadcast": sum(o["bytes"]["gather_broadcast"] for o in outs),
        "raw": sum(o["bytes"]["raw"] for o in rollouts),
    }
    verified = {k: all(o["verified"].get(k, False) for o in rollouts)
                for k in [f"weightbridge_{m}" for m in modes] + ["gather_broadcast", "checksums_on", "checksums_off"]}
    ck_on, ck_off = t("checksums_on"), t("checksums_off")
    tw = {m: t(f"weightbridge_{m}") for m in modes}
    a, b, c = tw["inline"], t("gather_broadcast"), t("raw")
    wb_peak = max(o["wb_stats"]["inline"]["peak_buffer_bytes"] for o in outs)
    keep = ("seconds", "pack_seconds", "unpack_seconds", "wait_seconds", "round_seconds", "rounds", "chunks",
            "bytes_sent", "bytes_received", "peak_buffer_bytes", "zero_copy_bytes_sent", "zero_copy_bytes_received")
    res = {
        "model_bytes": r.canonical.total_bytes(),
        "trainer_ranks": S, "rollout_ranks": R, "instances": args.instances,
        "plan": {"rounds": plan.num_rounds, "receiver_dedup": plan.receiver_dedup, "round_bytes": round_bytes,
                 "min_wire_bytes": plan.min_wire_bytes, "notes": list(plan.notes)},
        "seconds": {**{f"weightbridge_{m}": tw[m] for m in modes}, "gather_broadcast": b, "raw_p2p": c},
        "bytes_moved": moved,
        "ratio_b_over_a": b / a, "ratio_a_over_c": a / c, "ratio_c_over_a": c / a,
        "cost_model": {"network": net.name, "predicted_s": predicted_s, "lower_bound_s": bound_s,
                       "predicted_over_measured": predicted_s / a},
        "zero_copy_bytes": sum(o["wb_stats"]["inline"]["zero_copy_bytes_sent"]
                               + o["wb_stats"]["inline"]["zero_copy_bytes_received"] for o in outs),
        "checksums": {"on_s": ck_on, "off_s": ck_off, "ratio_on_over_off": ck_on / ck_off},
        "peak_buffer_bytes": wb_peak,
        "verified": verified,
        "wall_s": wall,
        "cpus": os.cpu_count(),
        "per_rank_stats": [
            {"side": o["side"], "rank": o["rank"],
             **{m: {f: (round(v, 4) if isinstance(v, float) else v) for f, v in o["wb_stats"][m].items() if f in keep}
                for m in modes}}
            for o in outs
        ],
    }
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = 1e6
        print(f"model {res['model_bytes'] / mb:.1f} MB bf16 | trainer Megatron TP{args.trainer_tp} -> "
              f"{args.instances} x vLLM TP{args.rollout_tp} | {S + R} processes on {os.cpu_count()} CPUs, Gloo loopback")
        print(f"plan: {plan.num_rounds} rounds of <= {args.round_mib} MiB, receiver_dedup={plan.receiver_dedup}; "
              f"best of {args.iters}, slowest rank; (a) and (c) alternate run by run")
        print(f"{'method':<34}{'seconds':>9}{'MB moved':>10}{'GB/s':>7}  verified")
        rows = [("(a) weightbridge (overlap=inline)", a, moved["weightbridge"], verified["weightbridge_inline"]),
                ("    weightbridge (overlap=thread)", tw["thread"], moved["weightbridge"], verified["weightbridge_thread"]),
                ("    weightbridge (overlap=off)", tw["off"], moved["weightbridge"], verified["weightbridge_off"]),
                ("(b) gather + broadcast", b, moved["gather_broadcast"], verified["gather_broadcast"]),
                ("(c) raw P2P bound", c, moved["raw"], "-")]
        for name, sec, nb, ok in rows:
            print(f"{name:<34}{sec:>9.3f}{nb / mb:>10.1f}{nb / sec / 1e9:>7.2f}  {ok}")
        print(f"b/a = {b / a:.2f}  (gather+broadcast time / weightbridge time)")
        print(f"a/c = {a / c:.2f}  (weightbridge time / raw P2P bound; c/a = {c / a:.2f} of the bound's throughput)")
        print(f"cost model ({net.name}): predicted {predicted_s:.3f} s / measured (a) {a:.3f} s = {predicted_s / a:.2f}  "
              f"(receiver de-replication {plan.receiver_dedup}; {plan.notes[0] if plan.notes else 'no decision needed'})")
        print(f"zero-copy: {res['zero_copy_bytes'] / mb:.1f} MB of (a)'s bytes sent or received without a pack/unpack copy")
        print(f"checksums on/off = {ck_on / ck_off:.3f}  ({ck_on:.3f} s with sync.checksums, the default, vs "
              f"{ck_off:.3f} s without; inline, alternating runs, verified {verified['checksums_on']})")
        print(f"peak wire-buffer bytes per rank: {wb_peak / mb:.1f} MB (cap 2 x round_bytes = {2 * round_bytes / mb:.1f} MB)")
    return 0 if all(verified.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
