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

    def __init__(self, ops: list[_Op], strict: bool = True) -> None:
        self.ops, self.strict = ops, strict

    def is_completed(self) -> bool:
        return all(op.done and (op.event is None or op.event.query()) for op in self.ops)

    def wait(self, *args: Any) -> bool:
        if self.strict:
            assert self.is_completed(), "the executor must poll is_completed() before wait() on NCCL"
        for op in self.ops:
            if op.event is not None:
                torch.cuda.current_stream(op.tensor.device).wait_event(op.event)
        return True


class LoopbackHub:
    """Matches sends and receives per (src, dst) in posting order, like NCCL P2P."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sends: dict[tuple[int, int], deque] = defaultdict(deque)
        self.recvs: dict[tuple[int, int], deque] = defaultdict(deque)
        self.max_batch = 0  # the most ops seen in one batch
        self.batches = 0

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

    def pending(self) -> int:
        """Ops posted and never matched (0 after a clean run)."""
        with self.lock:
            return sum(len(d) for d in self.sends.values()) + sum(len(d) for d in self.recvs.values())


class LoopbackNccl:
    """Bridge rank ``rank``'s backend object on ``hub`` (``BridgeGroup(LoopbackNccl(hub, r), r, ..., "nccl", ...)``)."""

    def __init__(self, hub: LoopbackHub, rank: int, strict: bool = True) -> None:
        self.hub, self.rank, self.strict = hub, rank, strict
        self.batch: list[_Op] | None = None
        self.aborted = False

    def _start_coalescing(self) -> None:
        assert self.batch is None, "a coalesced batch is already open"
        self.batch = []

    def _end_coalescing(self) -> LoopbackWork:
        batch, self.batch = self.batch, None
        assert batch, "empty coalesced batch"
        with self.hub.lock:
            self.hub.max_batch = max(self.hub.max_batch, len(batch))
            self.hub.batches += 1
        return LoopbackWork(batch, self.strict)

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

    def abort(self) -> None:
        self.aborted = True

    def shutdown(self) -> None:
        pass


__all__ = ["LoopbackHub", "LoopbackNccl", "LoopbackWork"]
