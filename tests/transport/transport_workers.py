"""Process entry points for the multiprocess transport tests (module-level, so they pickle)."""

from __future__ import annotations

import datetime
import os
import signal
import time
from typing import Any

import torch

from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.transport import Executor, create_bridge_group, open_store
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize, needed_names

FILL = 3.0  # destination value before the update; padding must keep it


def resolve(yaml_text: str):
    r, problems = check_text(yaml_text)
    assert r is not None and not problems, [str(p) for p in problems]
    return r


def make_plan(r, plan_kwargs: dict):
    return build_plan(r.trainer, r.rollout, **plan_kwargs)


def corrupt_first_message_to_each_peer() -> None:
    """This process sends the first data message part to each peer with its first byte flipped, after
    the checksum was computed (corruption on the wire): a trainer's first sends are its round 0."""
    from weightbridge.testing._internal.wire_tamper import flip_sent_bytes

    hit: set[int] = set()

    def choose(part: torch.Tensor, peer: int) -> int | None:
        if peer in hit:
            return None
        hit.add(peer)
        return 0

    flip_sent_bytes(choose)


def transfer(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of a transfer test. ``cfg``: see ``tests/transport/test_executor_mp.py``."""
    r = resolve(cfg["yaml"])
    plan = make_plan(r, cfg["plan"])
    if cfg.get("plan_hash"):
        assert plan.plan_hash == cfg["plan_hash"], "plans differ across processes"
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    timeout_s = cfg.get("timeout_s", 20.0)
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=timeout_s)
    if cfg.get("own_world"):
        # The process's own default group (trainer world of S, rollout world of R), like Megatron's or vLLM's.
        import torch.distributed as dist

        size = S if side == "trainer" else R
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"{side}_world/", store), rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    bridge = rank if side == "trainer" else S + rank
    group = create_bridge_group(
        store, rank=bridge, world_size=S + R, num_trainers=S, backend="gloo", timeout_s=timeout_s,
        prefix=cfg.get("prefix", "wb/data"),
    )
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    tdtype = r.trainer.ranks[0].tensors[0].dtype
    canon = canonical_tensors(r.canonical, seed=cfg.get("seed", 0), dtype=tdtype, names=needed_names(layout))
    if cfg.get("corrupt") and side == "trainer":
        corrupt_first_message_to_each_peer()
    ex = Executor(
        plan, group, side=side, rank=rank, device=torch.device("cpu"),
        chunk_bytes=cfg.get("chunk_bytes", 64 << 20), checksums=cfg.get("checksums", False),
        overlap=cfg.get("overlap", True), **({"direct_bytes": cfg["direct_bytes"]} if "direct_bytes" in cfg else {}),
    )
    on_round = None
    kill_after = cfg.get("kill_after_round")
    if kill_after is not None and cfg.get("kill_side", "trainer") == side and cfg.get("kill_rank", 0) == rank:

        def on_round(ridx: int, stats: Any) -> None:
            if stats.rounds > kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

    out: dict[str, Any] = {"side": side, "rank": rank}
    if cfg.get("trace_order"):
        out["events"] = _trace_order()
    t0 = time.monotonic()
    try:
        dst = empty_like_layout(layout, fill=FILL) if side == "rollout" else None
        # ``updates`` > 1: the same executor moves several versions (new trainer values each time).
        for version in range(cfg.get("updates", 1)):
            if version:
                canon = canonical_tensors(r.canonical, seed=cfg.get("seed", 0) + version, dtype=tdtype,
                                          names=needed_names(layout))
            if side == "trainer":
                tensors = materialize(layout, canon)
                time.sleep(cfg.get("stall_trainer_s", 0.0))
                stats = ex.run(tensors, on_round=on_round)
            elif cfg.get("stream"):  # streaming receive: every local tensor handed over once, complete
                shapes = {t.name: torch.empty(t.shape, dtype=dst[t.name].dtype, device="meta") for t in layout.tensors}
                got: dict[str, torch.Tensor] = {}
                handed: list[tuple[str, int]] = []

                def write(name: str, t: torch.Tensor) -> None:
                    assert name not in got, f"{name} handed twice"
                    got[name] = t.clone()
                    handed.append((name, len(handed)))

                stats = ex.run(shapes, on_round=on_round, stream=write)
                want = materialize(layout, canon, fill=0.0)  # uncovered elements of a streamed tensor are zeros
                out["diff"] = diff_tensors(got, want) + [f"{n} never handed" for n in want if n not in got]
                out["ntensors"] = len(got)
                out["handed"] = [n for n, _ in handed]
                if out["diff"]:
                    break
            else:
                stats = ex.run(dst, on_round=on_round)
                want = materialize(layout, canon, fill=FILL)
                out["diff"] = diff_tensors(dst, want)
                out["ntensors"] = len(dst)
                if out["diff"]:
                    break
        out["stats"] = stats.to_json()
        if cfg.get("own_world"):
            import torch.distributed as dist

            # The default group is untouched and still works.
            t = torch.ones(1)
            dist.all_reduce(t)
            out["default_world"] = (dist.get_world_size(), float(t.item()))
            dist.destroy_process_group()
    finally:
        out["elapsed"] = time.monotonic() - t0
    group.close()
    return out


class _DiesAfterPublishing(torch.distributed.Store):
    """The victim's store: SIGKILLs the process right after its own rendezvous address is stored, so
    it never connects to anyone (a rank killed between publishing and connecting)."""

    def __init__(self, inner: Any, own_key: str) -> None:
        super().__init__()
        self.inner, self.own_key = inner, own_key

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)
        if key.endswith(self.own_key):
            self.inner.set("victim-dead", "1")
            os.kill(os.getpid(), signal.SIGKILL)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    @property
    def timeout(self) -> Any:
        return self.inner.timeout


def group_member(port: int, rank: int, world: int, timeout_s: float, victim: int) -> dict[str, Any]:
    """One rank creating a Gloo bridge group. Rank ``victim`` starts first and dies as soon as its
    rendezvous address is on the store; the others start once it is dead and find its address: each
    is the connecting or the listening end of its pair with it (by address order). Returns how the
    creation ended and how long it took."""
    store = open_store("127.0.0.1", port, is_master=False, timeout_s=30)
    if rank == victim:
        store = _DiesAfterPublishing(store, f"0/{rank}")  # c10d's key of this rank's addresses
    else:
        store.wait(["victim-dead"])
    t0 = time.monotonic()
    try:
        create_bridge_group(store, rank=rank, world_size=world, num_trainers=1, backend="gloo", timeout_s=timeout_s,
                            prefix="g")
        return {"ok": True, "s": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"ok": False, "type": type(exc).__name__, "msg": str(exc)[:300], "s": time.monotonic() - t0}


def _trace_order() -> list:
    """Record, in this process, each round's ``RoundComm.start`` (ops issued, packed sends held back),
    ``RoundPipeline.pack_small`` and ``RoundComm.release``, in the order they happen."""
    from weightbridge.transport import comm as wc
    from weightbridge.transport import pipeline as wp

    events: list = []
    start, release, pack_small = wc.RoundComm.start, wc.RoundComm.release, wp.RoundPipeline.pack_small

    def traced_start(self, hold_packed_sends: bool = False) -> None:
        start(self, hold_packed_sends)
        events.append(("start", self.round_index, self.issued, len(self.held)))

    def traced_release(self) -> None:
        release(self)
        events.append(("release", self.round_index, self.issued, len(self.held)))

    def traced_pack_small(self, i: int, transfers: list) -> None:
        events.append(("pack_small", self.ex.my_rounds[i][0], None, None))
        pack_small(self, i, transfers)

    wc.RoundComm.start, wc.RoundComm.release = traced_start, traced_release
    wp.RoundPipeline.pack_small = traced_pack_small
    return events
