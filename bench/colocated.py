#!/usr/bin/env python
"""Benchmark: the colocated data plane (``sync.transport: shm``) vs Gloo loopback vs the peers' way, on CPU.

In ONE run, on the same processes, the same weights (a Qwen2-style model from a generated HF config,
bf16) and the SAME plan (built once, as the bridge builds it for ``shm``; its hash checked in every
process), an FSDP2 dp2 trainer (2 processes) updates one vLLM TP2 engine (2 processes), all on this host:

(a) **shm**: :class:`~weightbridge.transport.local_plane.LocalDataPlane` (one ``/dev/shm`` slab per
    sender per epoch, sealed round records on the control store, receivers unpack straight from the
    mapping);
(b) **Gloo loopback**: :class:`~weightbridge.sync.dataplane.TransportDataPlane` with ``transport: gloo``
    on the same plan (what a colocated job gets without the local plane);
(c) **the peers' way** (verl's shared-memory fallback, slime/OpenRLHF's colocated gather): the trainer
    ranks all-gather every tensor to trainer rank 0, which writes it whole into ``torch.multiprocessing``
    shared tensors (allocated and handed to the engine processes once, through a
    ``torch.multiprocessing`` queue, before timing: the cheapest form of that hand-off); a barrier; each
    engine process copies its TP slices out of them.

Each method is timed between barriers of all 4 processes after an untimed warm-up pass (slowest rank, best of ``--iters``, the methods
alternating run by run so this shared machine's noise hits them alike) and every rollout tensor is
verified bitwise after every run. Both data planes run with their defaults (``sync.checksums`` on).
**memcpy bound**: one single-threaded ``Tensor.copy_`` of the payload's size in the parent (best of 5):
the speed of moving each byte once. ``shm of memcpy`` = shm's GB/s / memcpy's GB/s (shm copies each
byte twice: into the slab, out of it; 0.5 is two copies at full speed without overlap).

    python bench/colocated.py                 # ~120 MB bf16 model, 2 -> TP2, 4 processes
    python bench/colocated.py --layers 2 --json
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

from weightbridge.localrun import ensure_env_secret, launch
from weightbridge.plan import build_plan, network_model
from weightbridge.plan.network import local_copy_of
from weightbridge.spec.resolve import check_text
from weightbridge.sync.auth import Signer
from weightbridge.sync.dataplane import TransportDataPlane
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize, needed_names
from weightbridge.testing._internal.bench_models import qwen2_config
from weightbridge.testing._internal.gather_broadcast import GatherBroadcast
from weightbridge.transport.local_plane import LocalDataPlane
from weightbridge.transport.store import open_store

FILL = 3.0
METHODS = ("shm", "gloo", "peers")


def spec_text(config_path: str, round_mib: int) -> str:
    return f"""
version: 1
model: {{config: {json.dumps(config_path)}}}
trainer: {{preset: fsdp2, mesh: {{dp: 2}}}}
rollout: {{preset: vllm, instances: 1, mesh: {{tp: 2}}}}
sync: {{round_bytes: {round_mib}MiB, transport: shm}}
"""


def _plan(r, round_bytes: int):
    net = network_model(r.network, local_copy=local_copy_of(r.sync.transport))
    return build_plan(r.trainer, r.rollout, round_bytes=round_bytes, receiver_dedup="auto", network=net)


def _pg(store, prefix: str, rank: int, size: int, timeout_s: float):
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, datetime.timedelta(seconds=timeout_s))


class Peers:
    """(c): full tensors on trainer rank 0, handed to the engine processes as shared tensors."""

    def __init__(self, r, side: str, rank: int, local: dict, tgroup, queues) -> None:
        self.gb = GatherBroadcast(r, side, rank, local, tgroup, None)
        self.r, self.side, self.rank = r, side, rank
        self.full: dict[str, torch.Tensor] = {}
        if side == "trainer" and rank == 0:  # shared once; every push writes into them
            self.full = {ct.name: torch.empty(ct.shape, dtype=self.gb.dtype).share_memory_() for ct in r.canonical}
            for q in queues:
                q.put(self.full)
        elif side == "rollout":
            self.full = queues[rank].get(timeout=120)

    def gather(self) -> int:
        """Trainer ranks: every tensor whole into the shared tensors (rank 0)."""
        return sum(self.gb.gather(ct, self.full.get(ct.name))[1] for ct in self.r.canonical)

    def take(self) -> int:
        """Rollout ranks (after the barrier that follows :meth:`gather`): slices out of the shared tensors."""
        for ct in self.r.canonical:
            self.gb.scatter(ct, self.full[ct.name])
        return sum(t.numel() * t.element_size() for t in self.full.values())


def worker(cfg: dict, queues) -> dict:
    r, problems = check_text(cfg["spec"])
    assert r is not None, problems
    plan = _plan(r, cfg["round_bytes"])
    assert plan.plan_hash == cfg["plan_hash"]  # the same plan in every process, for every method
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    me, W = (rank if side == "trainer" else S + rank), S + R
    timeout_s = cfg["timeout_s"]
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=timeout_s)
    allpg = _pg(store, "bench/all/", me, W, timeout_s)
    tgroup = _pg(store, "bench/trainers/", rank, S, timeout_s) if side == "trainer" else None
    signer = Signer(os.environ["WEIGHTBRIDGE_SECRET"].encode())

    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    canon = canonical_tensors(r.canonical, seed=1, names=needed_names(layout))
    local = materialize(layout, canon) if side == "trainer" else empty_like_layout(layout, fill=FILL)
    want = materialize(layout, canon, fill=FILL) if side == "rollout" else None
    del canon

    shm = LocalDataPlane(kind="shm", checksums=True, signer=signer)
    shm.place({b: shm.identity() for b in range(W)})  # one host: every pair local
    gloo = TransportDataPlane(transport="gloo", checksums=True, signer=signer)
    for name, plane in (("shm", shm), ("gloo", gloo)):
        plane.connect(store, prefix=f"bench/{name}/", bridge_rank=me, world_size=W, num_trainers=S,
                      timeout_s=timeout_s)
    assert shm.all_local
    peers = Peers(r, side, rank, local, tgroup, queues)
    version = {"v": 0}

    def plane_run(plane) -> int:
        version["v"] += 1
        st = plane.run(plan, side=side, rank=rank, tensors=local, dst=None, tag="bench", version=version["v"])
        return st.bytes_received

    def peers_run() -> int:
        n = peers.gather() if side == "trainer" else 0
        allpg.barrier().wait()
        return peers.take() if side == "rollout" else n

    runs = {"shm": lambda: plane_run(shm), "gloo": lambda: plane_run(gloo), "peers": peers_run}
    out: dict = {"side": side, "rank": rank, "times": {}, "verified": {}, "bytes": {}}
    for it in range(-1, cfg["iters"]):  # -1: a warm-up pass (slab mapping, Gloo's first send), not timed
        for name in (METHODS if it % 2 == 0 else METHODS[::-1]):
            if side == "rollout":
                for t in local.values():
                    t.fill_(FILL)
            allpg.barrier().wait()
            t0 = time.perf_counter()
            nbytes = runs[name]()
            allpg.barrier().wait()
            dt = time.perf_counter() - t0
            if side == "rollout":
                out["verified"][name] = out["verified"].get(name, True) and not diff_tensors(local, want)
            if it >= 0:
                out["times"][name] = min(out["times"].get(name, dt), dt)
            out["bytes"][name] = nbytes
    shm.close()
    gloo.close()
    allpg.barrier().wait()
    return out


def memcpy_gbps(nbytes: int, iters: int = 5) -> float:
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)  # pages touched
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(iters))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--round-mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch.multiprocessing as tmp_mp

    ensure_env_secret()  # the planes' signer, inherited by every process
    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-colocated-"))
    cfg_path = tmp / "config.json"
    cfg_path.write_text(json.dumps(qwen2_config(args.hidden, args.layers, args.vocab, args.intermediate, args.heads,
                                                args.kv_heads)))
    text = spec_text(str(cfg_path), args.round_mib)
    r, problems = check_text(text)
    if r is None:
        print("\n".join(str(p) for p in problems), file=sys.stderr)
        return 2
    round_bytes = args.round_mib << 20
    plan = _plan(r, round_bytes)
    S, R = r.trainer.world_size, r.rollout.world_size
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    ctx = tmp_mp.get_context("forkserver")
    queues = [ctx.Queue() for _ in range(R)]
    base = {"spec": text, "round_bytes": round_bytes, "plan_hash": plan.plan_hash, "port": store.port,
            "timeout_s": args.timeout, "iters": args.iters}
    cfgs = [({**base, "side": "trainer", "rank": t}, queues) for t in range(S)]
    cfgs += [({**base, "side": "rollout", "rank": q}, queues) for q in range(R)]
    t0 = time.monotonic()
    results = launch(worker, cfgs, timeout_s=args.timeout * 4)
    for res in results:
        if not res.ok:
            print(f"process {res.index}: FAILED {res.error!r} (exit {res.exitcode}, timed out {res.timed_out})\n"
                  f"{(res.traceback or '')[-2000:]}", file=sys.stderr)
    outs = [res.unwrap() for res in results]
    wall = time.monotonic() - t0
    rollouts = [o for o in outs if o["side"] == "rollout"]
    secs = {m: max(o["times"][m] for o in outs) for m in METHODS}
    payload = sum(o["bytes"]["shm"] for o in rollouts)  # the plan's bytes into the engine
    moved = {m: sum(o["bytes"][m] for o in (rollouts if m != "peers" else outs)) for m in METHODS}
    verified = {m: all(o["verified"].get(m, False) for o in rollouts) for m in METHODS}
    gbps = {m: payload / secs[m] / 1e9 for m in METHODS}  # the engine's update rate, same payload for all
    mem = memcpy_gbps(max(o["bytes"]["shm"] for o in rollouts))
    res = {"model_bytes": r.canonical.total_bytes(), "plan_hash": plan.plan_hash, "rounds": plan.num_rounds,
           "payload_bytes": payload, "seconds": secs, "gb_per_s": gbps, "bytes_moved": moved,
           "shm_vs_gloo": secs["gloo"] / secs["shm"], "shm_vs_peers": secs["peers"] / secs["shm"],
           "memcpy_gb_per_s": mem, "shm_of_memcpy": gbps["shm"] / mem, "verified": verified,
           "wall_s": wall, "cpus": os.cpu_count()}
    ok = all(verified.values())
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = 1e6
        print(f"model {res['model_bytes'] / mb:.1f} MB bf16 | FSDP2 dp2 -> vLLM TP2, 4 processes on {os.cpu_count()} "
              f"CPUs | plan {plan.plan_hash[:12]}, {plan.num_rounds} rounds of <= {args.round_mib} MiB, the same for all")
        print(f"best of {args.iters}, slowest rank, methods alternating; payload into the engine {payload / mb:.1f} MB")
        print(f"{'method':<40}{'seconds':>9}{'GB/s':>7}{'MB moved':>10}  verified")
        rows = [("(a) shm (LocalDataPlane)", "shm"), ("(b) Gloo loopback (TransportDataPlane)", "gloo"),
                ("(c) peers: gather to rank 0 + mp shared", "peers")]
        for label, m in rows:
            print(f"{label:<40}{secs[m]:>9.3f}{gbps[m]:>7.2f}{moved[m] / mb:>10.1f}  {verified[m]}")
        print(f"memcpy bound: {mem:.2f} GB/s (one Tensor.copy_ of {max(o['bytes']['shm'] for o in rollouts) / mb:.1f} MB)")
        print(f"gloo/shm = {res['shm_vs_gloo']:.2f}, peers/shm = {res['shm_vs_peers']:.2f} (time ratios)")
    print(f"shm vs gloo = {res['shm_vs_gloo']:.2f}x; shm of memcpy = {res['shm_of_memcpy']:.2f}; verified {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
