"""An in-process stand-in for NCCL: executors in threads of one process exchange bytes through a hub.

Harness (tests, ``bench/gpu_readiness.py``); never imported by product code. It lets the executor's
NCCL branch (coalesced batches, completion polling, device checksums, device slabs) run without
a second GPU, on CUDA tensors of one GPU or on CPU tensors.

:class:`LoopbackHub` matches the sends and receives of each (src, dst) pair in posting order, as
NCCL P2P does; :class:`LoopbackNccl` is the surface of ``ProcessGroupNCCL`` the executor uses
(``_start_coalescing`` / ``send`` / ``recv`` / ``_end_coalescing`` returning one ``Work`` per batch,
``is_completed()`` polled before ``wait()``). On CUDA it keeps NCCL's stream semantics: an op is
ordered after what its issuing thread queued on its current stream before it (an event recorded
at issue), the copy runs once both ends were issued, after both events, and completion is that
copy's event: a sender that forgot to order its packing before its send, or a receiver that read
before completion, sees wrong bytes here as it would with NCCL.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Any

import torch


class _Op:
    __slots__ = ("tensor", "issued", "done", "event")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.issued = _record(tensor)  # what the issuing thread queued before the op
        self.done = False
        self.event: Any = None  # CUDA: the copy's completion


def _record(t: torch.Tensor) -> Any:
    if not t.is_cuda:
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(t.device))
    return ev


class LoopbackWork:
    """One coalesced batch: complete when every op's copy completed (``strict``: ``wait()`` only after)."""

    def __init__(self, ops: list[_Op], strict: bool = True, on_wait: Any = None) -> None:
        self.ops, self.strict, self.on_wait = ops, strict, on_wait

    def is_completed(self) -> bool:
        return all(op.done and (op.event is None or op.event.query()) for op in self.ops)

    def wait(self, *args: Any) -> bool:
        if self.strict:
            assert self.is_completed(), "the executor must poll is_completed() before wait() on NCCL"
        for op in self.ops:
            if op.event is not None:
                torch.cuda.current_stream(op.tensor.device).wait_event(op.event)
        if self.on_wait is not None:
            self.on_wait, on_wait = None, self.on_wait
            on_wait()
        return True


class LoopbackHub:
    """Matches sends and receives per (src, dst) in posting order, like NCCL P2P."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sends: dict[tuple[int, int], deque] = defaultdict(deque)
        self.recvs: dict[tuple[int, int], deque] = defaultdict(deque)
        self.max_batch = 0  # the most ops seen in one batch
        self.batches = 0
        self.in_flight: dict[int, int] = defaultdict(int)  # per rank: batches issued and not yet waited for
        self.max_in_flight = 0
        self._reductions: dict[int, list] = {}  # the n-th all-reduce: [contributions, done flag holder]
        self._reduced: dict[int, int] = defaultdict(int)  # per rank: all-reduces posted

    def post(self, src: int, dst: int, op: _Op, is_send: bool) -> None:
        with self.lock:
            mine, other = (self.sends, self.recvs) if is_send else (self.recvs, self.sends)
            if not other[(src, dst)]:
                mine[(src, dst)].append(op)
                return
            peer = other[(src, dst)].popleft()
        send, recv = (op, peer) if is_send else (peer, op)
        if send.tensor.numel() != recv.tensor.numel():
            raise AssertionError(f"chunk sizes differ between the two ends: {send.tensor.numel()} sent, "
                                 f"{recv.tensor.numel()} received")
        if recv.tensor.is_cuda or send.tensor.is_cuda:
            stream = torch.cuda.current_stream(recv.tensor.device if recv.tensor.is_cuda else send.tensor.device)
            for ev in (send.issued, recv.issued):
                if ev is not None:
                    stream.wait_event(ev)
            recv.tensor.copy_(send.tensor)
            done = torch.cuda.Event()
            done.record(stream)
            send.event = recv.event = done
        else:
            recv.tensor.copy_(send.tensor)
        send.done = recv.done = True

    def allreduce(self, rank: int, size: int, t: torch.Tensor) -> _Op:
        """Rank ``rank``'s part of an all-reduce (sum) of ``size`` ranks: complete once all of them posted
        (a group's first all-reduce creates its communicator: a rank that never comes leaves it pending)."""
        op = _Op(t)
        with self.lock:
            n = self._reduced[rank]
            self._reduced[rank] += 1
            parts = self._reductions.setdefault(n, [])
            parts.append(op)
            if len(parts) < size:
                return op
            del self._reductions[n]
        total = sum(o.tensor for o in parts)
        for o in parts:
            o.tensor.copy_(total)
            o.done = True
        return op

    def pending(self) -> int:
        """Ops posted and never matched (0 after a clean run)."""
        with self.lock:
            return sum(len(d) for d in self.sends.values()) + sum(len(d) for d in self.recvs.values())


class LoopbackNccl:
    """Bridge rank ``rank``'s backend object on ``hub`` (``BridgeGroup(LoopbackNccl(hub, r), r, ..., "nccl", ...)``)."""

    def __init__(self, hub: LoopbackHub, rank: int, strict: bool = True, size: int = 1) -> None:
        self.hub, self.rank, self.strict, self.size = hub, rank, strict, size
        self.batch: list[_Op] | None = None
        self.aborted = False

    def _start_coalescing(self) -> None:
        assert self.batch is None, "a coalesced batch is already open"
        self.batch = []

    def _end_coalescing(self) -> LoopbackWork:
        batch, self.batch = self.batch, None
        assert batch, "empty coalesced batch"
        hub = self.hub
        with hub.lock:
            hub.max_batch = max(hub.max_batch, len(batch))
            hub.batches += 1
            hub.in_flight[self.rank] += 1
            hub.max_in_flight = max(hub.max_in_flight, hub.in_flight[self.rank])

        def waited() -> None:
            with hub.lock:
                hub.in_flight[self.rank] -= 1

        return LoopbackWork(batch, self.strict, waited)

    def _op(self, t: torch.Tensor, peer: int, is_send: bool) -> _Op:
        assert self.batch is not None, "NCCL P2P must be issued inside a coalesced batch"
        assert t.is_contiguous() and t.dtype == torch.uint8
        op = _Op(t)
        src, dst = (self.rank, peer) if is_send else (peer, self.rank)
        self.batch.append(op)
        self.hub.post(src, dst, op, is_send)
        return op

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _Op:
        return self._op(tensors[0], dst, True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> _Op:
        return self._op(tensors[0], src, False)

    def allreduce(self, tensors: list[torch.Tensor]) -> LoopbackWork:
        return LoopbackWork([self.hub.allreduce(self.rank, self.size, tensors[0])], self.strict)

    def abort(self) -> None:
        self.aborted = True

    def shutdown(self) -> None:
        pass


def loopback_parts(hub: LoopbackHub) -> Any:
    """:class:`~weightbridge.transport.group.NcclParts` building :class:`LoopbackNccl` groups on ``hub`` (CPU):
    ``create_bridge_group(backend="nccl")``'s creation logic (helper thread, first all-reduce, deadline,
    abort) without NCCL. Install it with ``monkeypatch.setattr(group, "_nccl_parts", lambda device: parts)``."""
    from weightbridge.transport.group import NcclParts, first_allreduce

    def make(store: Any, rank: int, world_size: int, timeout_s: float) -> LoopbackNccl:
        return LoopbackNccl(hub, rank, size=world_size)

    return NcclParts(torch.device("cpu"), make, lambda pg, abandoned: first_allreduce(pg, torch.zeros(1), abandoned))


class LoopbackWorld:
    """Every rank of ``plan`` as an :class:`~weightbridge.transport.executor.Executor` of this process on one
    hub (bridge ranks: trainers first); :meth:`run` runs one update with a thread per rank."""

    def __init__(self, plan: Any, *, device: torch.device | str = "cpu", timeout_s: float = 5.0,
                 **executor_kwargs: Any) -> None:
        from weightbridge.transport.executor import Executor
        from weightbridge.transport.group import BridgeGroup

        device = torch.device(device)
        S, R = plan.num_senders, plan.num_receivers
        self.hub = LoopbackHub()
        self.groups = [BridgeGroup(LoopbackNccl(self.hub, b, size=S + R), b, S + R, "nccl", S, timeout_s, device)
                       for b in range(S + R)]
        self.trainers = [Executor(plan, self.groups[t], side="trainer", rank=t, device=device, **executor_kwargs)
                         for t in range(S)]
        self.rollouts = [Executor(plan, self.groups[S + q], side="rollout", rank=q, device=device, **executor_kwargs)
                         for q in range(R)]

    def run(self, sources: list[Any], dsts: list[Any], *, version: int | None = None, wall_s: float = 60.0,
            caller: Any = None) -> list[Any]:
        """One update: trainer ``t`` sends ``sources[t]``, rollout ``q`` receives into ``dsts[q]``; the ranks'
        ``ExecStats`` (trainers first). ``caller(side, rank, fn)`` calls ``fn()`` on the rank's thread (a
        test's context, e.g. a CUDA stream); the first rank's error is raised; a rank still running after
        ``wall_s`` is an ``AssertionError``."""
        jobs = [("trainer", t, lambda ex=ex, s=sources[t]: ex.run(s, version=version))
                for t, ex in enumerate(self.trainers)]
        jobs += [("rollout", q, lambda ex=ex, d=dsts[q]: ex.run(d, version=version)) for q, ex in enumerate(self.rollouts)]
        out: list[Any] = [None] * len(jobs)

        def body(i: int, side: str, rank: int, fn: Any) -> None:
            try:
                out[i] = ("ok", fn() if caller is None else caller(side, rank, fn))
            except BaseException as exc:  # noqa: BLE001 - raised below, on the calling thread
                out[i] = ("error", exc)

        threads = [threading.Thread(target=body, args=(i, *job), daemon=True, name=f"loopback-{job[0]}-{job[1]}")
                   for i, job in enumerate(jobs)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(wall_s)
        hung = [th.name for th in threads if th.is_alive()]
        if hung:
            raise AssertionError(f"ranks still running after {wall_s:g} s: {', '.join(hung)}")
        for status, value in out:
            if status == "error":
                raise value
        return [value for _, value in out]


def odd_sized_layouts() -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """``(trainer, rollout, canonical tensors)``: one trainer holding int8 [3], bfloat16 [5], bool [5],
    float8 [7] and float32 [4] tensors, two rollout instances of one rank each, so the trainer's slab holds
    two 41 B buckets (+ 8 B trailers), the second one at offset 49 (an odd storage offset)."""
    from weightbridge.layout.box import full_box
    from weightbridge.layout.ir import LocalTensor, Piece, RankLayout, SideLayout
    from weightbridge.tensors import torch_dtype

    specs = {"a": ("int8", (3,)), "b": ("bfloat16", (5,)), "c": ("bool", (5,)), "d": ("float8_e4m3fn", (7,)),
             "e": ("float32", (4,))}
    g = torch.Generator().manual_seed(11)
    canon = {}
    for name, (dt, shape) in specs.items():
        vals = torch.randint(-100, 100, shape, generator=g)
        canon[name] = (vals > 0) if dt == "bool" else vals.to(torch.float32).div(7).to(torch_dtype(dt))

    def rank(side: str, r: int) -> Any:
        ts = tuple(LocalTensor(n, s, dt, (Piece(n, full_box(s), full_box(s), False),)) for n, (dt, s) in specs.items())
        return RankLayout(side, r, ts, instance=r if side == "rollout" else 0)

    trainer = SideLayout("trainer", (rank("trainer", 0),))
    rollout = SideLayout("rollout", (rank("rollout", 0), rank("rollout", 1)), num_instances=2)
    return trainer, rollout, canon


__all__ = ["LoopbackHub", "LoopbackNccl", "LoopbackWork", "LoopbackWorld", "loopback_parts", "odd_sized_layouts"]
