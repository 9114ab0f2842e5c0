"""One executor's CUDA stream, ordered against its caller's stream by explicit events.

Every copy, checksum kernel and NCCL op of a run is issued with the executor's own stream current:
on the calling thread and, with ``overlap="thread"``, on the worker thread (which before packed on
its own default stream, so NCCL, ordered after the *issuing* thread's current stream, could send a
buffer still being packed). The bridge's work then never queues behind, nor delays, the engine's
own kernels on the streams the engine uses.

* :meth:`ExecStreams.begin` (the caller's thread, when a run starts): an event recorded on the
  caller's current stream (what it queued there, e.g. writes into the source tensors, from a
  non-default stream too), and the executor's stream waits for it;
* :meth:`ExecStreams.use`: the executor's stream made current (every thread issuing work of the run);
* :meth:`ExecStreams.end` (the caller's thread, when the run returns or fails): an event recorded on
  the executor's stream; the caller's stream waits for it and the host synchronises on it, so a run
  returns with every byte in place (one host synchronisation per run).

Off CUDA every method does nothing. ``api`` is ``torch.cuda``; ``bench/gpu_readiness.py --dry-run``
passes a CPU stand-in with the same surface (``Stream``, ``Event``, ``current_stream``, ``stream``)
that checks the order of these calls.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class ExecStreams:
    """The stream of one executor on ``device`` (inactive unless CUDA, or a given ``api``)."""

    def __init__(self, device: torch.device | str, api: Any = None) -> None:
        self.device = torch.device(device)
        if api is None and self.device.type == "cuda":
            api = torch.cuda
        self.api = api
        self.stream = api.Stream(device=self.device) if api is not None else None
        self.caller: Any = None  # the caller's stream of the run in progress
        self.syncs = 0  # host synchronisations done by end()

    @property
    def active(self) -> bool:
        return self.stream is not None

    def begin(self) -> None:
        """The executor's stream waits for what the caller queued on its current stream so far."""
        if self.stream is None:
            return
        self.caller = self.api.current_stream(self.device)
        ready = self.api.Event()
        ready.record(self.caller)
        self.stream.wait_event(ready)

    def use(self) -> Any:
        """A context making the executor's stream current on this thread."""
        return self.api.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def end(self) -> None:
        """The caller's stream, and the host, wait for everything queued on the executor's stream."""
        if self.stream is None:
            return
        done = self.api.Event()
        done.record(self.stream)
        caller, self.caller = self.caller, None
        if caller is not None:
            caller.wait_event(done)
        done.synchronize()
        self.syncs += 1


def stream_device(*devices: torch.device) -> torch.device:
    """The device whose stream an executor uses: the first CUDA one of ``devices`` (wire buffers, then
    tensors: Gloo with CUDA tensors packs on the tensors' device), else CPU."""
    for dev in devices:
        if dev.type == "cuda":
            return dev
    return torch.device("cpu")


__all__ = ["ExecStreams", "stream_device"]
