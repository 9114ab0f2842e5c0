"""The in-process stages of ``bench/gpu_readiness.py`` (each a ``localrun.launch`` target: one fresh process).

Harness; never imported by product code. Every stage takes ``cfg`` (``dry``: CPU stand-ins instead of
CUDA and NCCL, and the sizes) and returns ``{"status": "PASS" | "FAIL", "checks": [...], ...}``; a
check is ``{"name", "ok", "detail"}`` (``"error"`` with the traceback's end when it raised), so one
failing call never hides the others. With ``dry`` every stage runs the same code on CPU: the NCCL
group through :func:`weightbridge.testing._internal.loopback.loopback_parts`, streams through
:class:`weightbridge.testing._internal.cuda_standin.RecordingCuda`.
"""

from __future__ import annotations

import datetime
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

TINY = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
"""


class Checks:
    """The checks of one stage, in order."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``: a check passes unless it raises or returns False; what else it returns is its detail."""
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the stage goes on
            tb = traceback.format_exc()
            self.items.append({"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                               "traceback": tb[-1500:], "seconds": time.perf_counter() - t0})
            return None
        ok = out is not False
        self.items.append({"name": name, "ok": ok, "detail": None if isinstance(out, bool) else out,
                           "seconds": round(time.perf_counter() - t0, 4)})
        return out

    def result(self, **extra: Any) -> dict:
        return {"status": "PASS" if all(c["ok"] for c in self.items) else "FAIL", "checks": self.items, **extra}


def _device(cfg: dict) -> torch.device:
    return torch.device("cpu") if cfg["dry"] else torch.device("cuda", 0)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _poll(work: Any, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no completion within {limit_s:g} s")
        time.sleep(0.0005)
    work.wait()


# -- 1. versions and GPU identity ---------------------------------------------------------------------
def stage_versions(cfg: dict) -> dict:
    import platform
    from importlib import metadata

    from weightbridge import _torch_compat as compat
    from weightbridge.transport.identity import gpu_uuid, host_identity, identity_of

    c = Checks()
    try:
        wb = metadata.version("weightbridge-rl")
    except metadata.PackageNotFoundError:
        wb = "source checkout"
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "weightbridge": wb, "tested": compat.TESTED,
                            "torch_is_tested_minor": compat.TORCH_TESTED, "host": host_identity()}
    info["private_apis"] = c.run("private torch APIs present", lambda: _present(compat))
    if cfg["dry"]:
        info["identity"] = identity_of("gloo", "cpu").model_dump()
        return c.result(**info)
    dev = _device(cfg)
    props = torch.cuda.get_device_properties(dev)
    info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                gpus=torch.cuda.device_count())
    info["uuid"] = c.run("GPU UUID (GPU-... or MIG-...)", lambda: _uuid(gpu_uuid(dev)))
    info["nccl"] = c.run("NCCL available", lambda: compat.nccl_available() and str(torch.cuda.nccl.version()))
    info["identity"] = identity_of("nccl", dev).model_dump()
    return c.result(**info)


def _present(compat: Any) -> dict:
    found = compat.check()
    missing = [name for name, ok in found.items() if ok is False]
    if missing:
        raise RuntimeError(f"missing: {', '.join(missing)}")
    return found


def _uuid(uuid: str | None) -> str:
    if not uuid or not uuid.startswith(("GPU-", "MIG-")):
        raise RuntimeError(f"torch reports UUID {uuid!r}")
    return uuid


# -- 2. every private torch/NCCL call, on one-rank groups -------------------------------------------------
def stage_nccl_calls(cfg: dict) -> dict:
    """A one-rank NCCL group (non-blocking init, the first all-reduce), a coalesced self send/recv, abort
    and shutdown; creation aborted at its deadline while a second rank never comes, then a healthy
    group again; Gloo's options, version counters, batched copies. Fails if any private torch API the
    library uses (``_torch_compat.APIS``) went unexercised."""
    import torch.distributed as dist

    from weightbridge import _torch_compat as compat
    from weightbridge.testing._internal.loopback import LoopbackHub, loopback_parts
    from weightbridge.transport import group as G
    from weightbridge.transport.errors import PeerTimeout

    c, dev, used = Checks(), _device(cfg), set()
    if cfg["dry"]:
        hub = LoopbackHub()
        G._nccl_parts = lambda device: loopback_parts(hub)  # this process only: the stand-in NCCL
    parts = G._nccl_parts(dev if not cfg["dry"] else None)

    def one_rank() -> Any:
        pg = parts.make(dist.HashStore(), 0, 1, 30.0)
        t0 = time.perf_counter()
        parts.init(pg, lambda: False)
        if not cfg["dry"]:
            used.update({"ProcessGroupNCCL.Options.config.blocking", "Backend.Options._timeout"})
        return pg, time.perf_counter() - t0

    def coalesced(pg: Any) -> dict:
        a = (torch.arange(1 << 20, device=dev) % 251).to(torch.uint8)
        b = torch.zeros_like(a)
        compat.start_coalescing(pg)
        pg.send([a], 0, 0)
        pg.recv([b], 0, 0)
        work = compat.end_coalescing(pg)
        _poll(work, 30.0)
        _sync(dev)
        used.update({"Backend._start_coalescing", "Backend._end_coalescing"})
        return {"equal": bool(torch.equal(a, b))} if torch.equal(a, b) else False

    made: dict[str, Any] = {}

    def first() -> dict:
        made["pg"], init_s = one_rank()
        return {"init_s": round(init_s, 4)}

    if c.run("one-rank group: non-blocking init + first all-reduce", first):
        c.run("coalesced self send/recv, completion polled", lambda: coalesced(made["pg"]))
        c.run("abort()", lambda: made["pg"].abort() or True)
    second = c.run("a second group, shutdown()", lambda: one_rank()[0].shutdown() or True)

    def abort_at_deadline() -> dict:
        from weightbridge.transport.store import open_store

        store = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)
        limit = float(cfg["abort_timeout_s"])
        t0 = time.monotonic()
        try:
            G.create_bridge_group(store, rank=0, world_size=2, num_trainers=1, backend="nccl", timeout_s=limit,
                                  device=None if cfg["dry"] else dev)
        except PeerTimeout as exc:
            took = time.monotonic() - t0
            if took > limit + 2:
                raise RuntimeError(f"PeerTimeout after {took:.1f} s, limit {limit:g} + 2 s") from exc
            return {"raised": "PeerTimeout", "seconds": round(took, 2)}
        raise RuntimeError("a group of two ranks was created with one rank")

    c.run("init aborted at the deadline (the other rank never comes)", abort_at_deadline)
    c.run("healthy after the abort: a new group, send/recv", lambda: coalesced(one_rank()[0]) if second else False)

    def gloo() -> bool:
        opts = compat.gloo_options(datetime.timedelta(seconds=30), "127.0.0.1")
        pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, opts)
        t = torch.ones(4)
        pg.allreduce([t]).wait()
        used.update({"ProcessGroupGloo._Options", "Backend.Options._timeout"})
        return bool(torch.equal(t, torch.ones(4)))

    c.run("Gloo options (listen on 127.0.0.1)", gloo)

    def tensors() -> bool:
        t = torch.zeros(3, device=dev)
        t.add_(1)
        dst = [torch.zeros(2, device=dev), torch.zeros(3, device=dev, dtype=torch.bfloat16)]
        compat.foreach_copy(dst, [torch.ones(2, device=dev), torch.full((3,), 2.0, device=dev)])
        used.update({"Tensor._version", "torch._foreach_copy_"})
        return compat.version_counter(t) == 1 and dst[1].tolist() == [2.0, 2.0, 2.0]

    c.run("version counter, batched copy", tensors)

    def coverage() -> dict:
        applicable = {name for name, ok in compat.check().items() if ok}
        missed = sorted(applicable - used)
        if missed:
            raise RuntimeError(f"not exercised: {', '.join(missed)}")
        return {"exercised": sorted(used)}

    c.run("every private torch API of _torch_compat exercised", coverage)
    return c.result()


# -- 3. the executor's CUDA path through the loopback stand-in for NCCL ------------------------------------
def stage_executor(cfg: dict) -> dict:
    """Every rank of a plan in this process (:class:`~weightbridge.testing._internal.loopback.LoopbackWorld`: the
    executor's NCCL branch on one device): device slabs, zero-copy, checksums (odd offsets too), delta,
    thread overlap, callers on non-default streams; every rollout tensor compared bitwise."""
    from weightbridge.plan import build_plan
    from weightbridge.spec.resolve import check_text
    from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize
    from weightbridge.testing._internal.loopback import LoopbackWorld, odd_sized_layouts

    c, dev = Checks(), _device(cfg)
    r, problems = check_text(TINY)
    if r is None:
        raise RuntimeError(problems)
    plan = build_plan(r.trainer, r.rollout, round_bytes=cfg["round_bytes"])
    S, R = r.trainer.world_size, r.rollout.world_size
    v1 = canonical_tensors(r.canonical, seed=1)
    v2 = {k: t.clone() for k, t in v1.items()}
    for t in v2.values():
        t.view(-1)[::97] += 1  # about 1% of the elements change: deltas
    srcs = {v: [materialize(r.trainer.ranks[t], canon, device=dev) for t in range(S)] for v, canon in ((1, v1), (2, v2))}

    def verify(dsts: list, canon: dict, layouts: Any = r.rollout) -> list[str]:
        diffs = [d for q, dst in enumerate(dsts)
                 for d in diff_tensors({k: x.cpu() for k, x in dst.items()}, materialize(layouts.ranks[q], canon))]
        if diffs:
            raise RuntimeError("; ".join(diffs[:3]))
        return []

    def fresh() -> list:
        return [empty_like_layout(r.rollout.ranks[q], device=dev, fill=3.0) for q in range(R)]

    def shipped(**kw: Any) -> dict:
        world = LoopbackWorld(plan, device=dev, checksums=True, **kw)
        dsts = fresh()
        stats = world.run(srcs[1], dsts, wall_s=cfg["wall_s"])
        verify(dsts, v1)
        slab = world.trainers[0]._slabs[0]
        if slab is None or slab.device.type != dev.type:
            raise RuntimeError(f"wire slab on {None if slab is None else slab.device}, expected {dev.type}")
        zero = sum(st.zero_copy_bytes_sent + st.zero_copy_bytes_received for st in stats)
        if not zero or world.hub.max_in_flight < 2:
            raise RuntimeError(f"{zero} B zero-copy, {world.hub.max_in_flight} batches in flight (want > 0, >= 2)")
        return {"zero_copy_bytes": zero, "batches_in_flight": world.hub.max_in_flight,
                "seconds": round(max(st.seconds for st in stats), 4)}

    # items of >= 4 KiB as messages of their own (zero-copy where contiguous), 4 KiB chunks (several waves)
    small = {"direct_bytes": 4096, "chunk_bytes": 4096}
    c.run("inline overlap, checksums, zero-copy, device slabs, waves in flight", lambda: shipped(**small))
    c.run("thread overlap", lambda: shipped(overlap="thread", **small))

    def delta() -> dict:
        world = LoopbackWorld(plan, device=dev, checksums=True, delta="on", chunk_bytes=4096)
        dsts = fresh()
        world.run(srcs[1], dsts, version=1, wall_s=cfg["wall_s"])
        verify(dsts, v1)
        stats = world.run(srcs[2], dsts, version=2, wall_s=cfg["wall_s"])
        verify(dsts, v2)
        deltas = sum(st.delta_buckets for st in stats[:S])
        if not deltas:
            raise RuntimeError("no bucket went as a delta")
        return {"delta_buckets": deltas}

    c.run("delta updates (two versions)", delta)
    c.run("callers on non-default streams", lambda: _caller_streams(cfg, plan, srcs, v1, v2, fresh, verify))

    def odd() -> bool:
        trainer, rollout, canon = odd_sized_layouts()
        odd_plan = build_plan(trainer, rollout, round_bytes=1 << 20)
        dsts = [empty_like_layout(rollout.ranks[q], device=dev) for q in range(2)]
        LoopbackWorld(odd_plan, device=dev, checksums=True).run([materialize(trainer.ranks[0], canon, device=dev)],
                                                               dsts, wall_s=cfg["wall_s"])
        return verify(dsts, canon, rollout) == []

    c.run("int8/bool/fp8 items at odd slab offsets, checksums", odd)
    return c.result()


def _caller_streams(cfg: dict, plan: Any, srcs: dict, v1: dict, v2: dict, fresh: Callable, verify: Callable) -> dict:
    """Trainers write version 2 into their source tensors on their own stream, after a delay queued there,
    and push at once without synchronising: the executor must order its packing after that stream.
    Rollouts read what arrived on the default stream right after the run returns. On CPU (dry) the
    order of the stand-in's events is checked instead."""
    from weightbridge.testing._internal.cuda_standin import RecordingCuda
    from weightbridge.testing._internal.loopback import LoopbackWorld
    from weightbridge.transport.streams import ExecStreams

    dev = _device(cfg)
    world = LoopbackWorld(plan, device=dev, checksums=True, overlap="thread")
    S = plan.num_senders
    stale = [{k: t.clone() for k, t in src.items()} for src in srcs[1]]  # version 1 until the callers write
    api: Any = RecordingCuda() if cfg["dry"] else torch.cuda
    if cfg["dry"]:
        for ex in world.trainers + world.rollouts:
            ex.streams = ExecStreams("cpu", api=api)
    streams = {("trainer", t): api.Stream(device=dev) for t in range(S)}
    streams |= {("rollout", q): api.Stream(device=dev) for q in range(plan.num_receivers)}

    def caller(side: str, rank: int, fn: Callable) -> Any:
        with api.stream(streams[(side, rank)]):
            if side == "trainer":
                if not cfg["dry"]:
                    torch.cuda._sleep(cfg["sleep_cycles"])  # the write lands late on this stream
                for name, t in stale[rank].items():
                    t.copy_(srcs[2][rank][name])
            return fn()

    dsts = fresh()
    _sync(dev)  # the clones and fills above ran on the default stream, the callers use others
    stats = world.run(stale, dsts, caller=caller, wall_s=cfg["wall_s"])
    verify(dsts, v2)
    executors = world.trainers + world.rollouts
    out = {"host_syncs_per_run": max(ex.streams.syncs for ex in executors)}
    if cfg["dry"]:  # each executor's stream first waited for an event recorded on its caller's stream
        on = {e[2]: e[1] for e in api.log if e[0] == "record"}
        callers = {st.name for st in streams.values()}
        firsts = [next(e for e in api.log if e[1] == ex.streams.stream.name) for ex in executors]
        if not all(e[0] == "wait" and on.get(e[2]) in callers for e in firsts):
            raise RuntimeError(f"an executor's stream did not start by waiting for its caller's: {firsts}")
        out["stand_in_events"] = len(api.log)
    out["seconds"] = round(max(st.seconds for st in stats), 4)
    return out


# -- 4. microbenchmarks ---------------------------------------------------------------------------------
def stage_micro(cfg: dict) -> dict:
    """GB/s of the device checksum (one round's fetch included) against XXH3 on the host; delta encode of
    a bucket (full, then ~1% changed); pack of many small items, batched against one call per item."""
    from weightbridge.plan.types import WireItem
    from weightbridge.tensors import pack_items, torch_dtype
    from weightbridge.transport.wire import bucket_sum, resolve

    c, dev = Checks(), _device(cfg)

    def timed(fn: Callable[[], Any], reps: int = 3) -> float:
        fn()
        _sync(dev)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            best = min(best, time.perf_counter() - t0)
        return best

    n = cfg["checksum_mib"] << 20
    buf = torch.randint(0, 256, (n + 1,), dtype=torch.uint8, device=dev)

    def checksums() -> dict:
        from weightbridge.transport.wire import checksum

        dev_s = timed(lambda: resolve([bucket_sum([buf[1:]], on_device=True)]))  # at an odd offset
        host = buf[1:].cpu()
        host_s = timed(lambda: checksum(host))
        return {"bytes": n, "device_GBps": round(n / dev_s / 1e9, 2), "xxh3_host_GBps": round(n / host_s / 1e9, 2)}

    c.run("checksum", checksums)
    c.run("delta encode", lambda: _delta_encode(cfg, dev, timed))

    def pack() -> dict:
        out: dict[str, Any] = {}
        for adjacent in (True, False):
            items, tensors = [], {}
            per, rows, cols = (16 if adjacent else 1), 8, 64
            for k in range(cfg["pack_items"] // per):
                name = f"t{k}"
                tensors[name] = torch.randn(per * rows, cols, device=dev).to(torch_dtype("bfloat16"))
                for j in range(per):
                    box = ((j * rows, (j + 1) * rows), (0, cols))
                    items.append(WireItem(name, box, name, box, False, name, box, False, "bfloat16", rows * cols * 2))
            wire = torch.empty(sum(it.nbytes for it in items), dtype=torch.uint8, device=dev)
            offsets = [i * rows * cols * 2 for i in range(len(items))]
            one_s = timed(lambda: [pack_items((it, ), tensors, wire, off) for it, off in zip(items, offsets)], reps=1)
            batched_s = timed(lambda: pack_items(items, tensors, wire), reps=2)
            key = "adjacent" if adjacent else "separate"
            out[key] = {"items": len(items), "per_item_s": round(one_s, 4), "batched_s": round(batched_s, 4),
                        "speedup": round(one_s / batched_s, 2)}
        return out

    c.run("pack many small items", pack)
    return c.result()


def _delta_encode(cfg: dict, dev: torch.device, timed: Callable) -> dict:
    from weightbridge.plan import build_plan
    from weightbridge.spec.resolve import check_text
    from weightbridge.tensors import canonical_tensors, materialize
    from weightbridge.transport import delta as wd

    r, problems = check_text(TINY)
    if r is None:
        raise RuntimeError(problems)
    plan = build_plan(r.trainer, r.rollout, round_bytes=64 << 20)
    b = max((b for rnd in plan.rounds for b in rnd.buckets if b.src_side == "trainer" and b.sender == 0),
            key=lambda b: b.nbytes)
    src = materialize(r.trainer.ranks[0], canonical_tensors(r.canonical, seed=1), device=dev)
    geo = wd.geometry(b)
    buf = torch.empty(wd.HEADER_BYTES + b.nbytes + 8, dtype=torch.uint8, device=dev)
    state, versions = wd.SendState(), iter(range(1, 1000))
    full_s = timed(lambda: wd.encode_bucket(buf, b, geo, src, wd.SendState(), version=1, mode="on"))
    wd.encode_bucket(buf, b, geo, src, state, version=next(versions), mode="on")
    for t in src.values():
        t.view(-1)[::97] += 1

    def again() -> Any:
        return wd.encode_bucket(buf, b, geo, src, state, version=next(versions), mode="on")

    enc = again()
    delta_s = timed(again)
    return {"bucket_bytes": b.nbytes, "full_GBps": round(b.nbytes / full_s / 1e9, 3),
            "delta_GBps": round(b.nbytes / delta_s / 1e9, 3), "kind": "delta" if enc.kind == wd.DELTA else "full",
            "changed": enc.changed}


__all__ = ["stage_executor", "stage_micro", "stage_nccl_calls", "stage_versions"]
