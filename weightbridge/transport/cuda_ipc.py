"""CUDA slabs shared between processes of one host (``sync.transport: ipc``), as data, never pickled.

A sender allocates one ``uint8`` slab per epoch on its GPU and reduces it once with
``torch.multiprocessing.reductions.reduce_tensor`` (the CUDA IPC memory handle, torch's producer
reference counter, its allocation event); :func:`export_slab` turns that into a
:class:`~weightbridge.sync.local_records.CudaHandle` (hex strings and integers, the device named by its
UUID) that the sender publishes sealed on the control store. A reader calls :func:`import_slab` once
per epoch: it finds the device with that UUID among the ones *it* sees (processes number GPUs
differently under ``CUDA_VISIBLE_DEVICES``) and rebuilds the slab with torch's own
``rebuild_cuda_tensor`` from whitelisted classes and the decoded fields (what unpickling would do, minus
unpickling). The imported tensor is kept for the epoch: rebuilding it per round would leave torch's
IPC reference count to the producer's mercy.

Ordering: the sender records an interprocess event (``torch.cuda.Event(interprocess=True)``) on its
stream after packing each round and publishes the round after that, without waiting on the host; the
reader's stream waits for the event before unpacking, and the reader synchronises its stream before
it acknowledges the round (only then may the sender overwrite the region).

Only runs with CUDA; ``bench/gpu_ipc_stage.py`` exercises it between two processes on one GPU
(``bench/gpu_readiness.py`` calls it). On CPU the tests check the handle's encoding and the UUID lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from weightbridge.sync.local_records import CudaHandle

__all__ = ["ExportedSlab", "ImportedSlab", "device_index_of", "export_slab", "handle_of", "import_slab",
           "rebuild_args"]


def device_index_of(uuid: str, *, count: Callable[[], int] | None = None,
                    uuid_of: Callable[[torch.device], str | None] | None = None) -> int:
    """This process's index of the GPU named ``uuid``; ``ValueError`` when it does not see that GPU."""
    from weightbridge.transport.identity import gpu_uuid

    count = count or torch.cuda.device_count
    uuid_of = uuid_of or gpu_uuid
    seen = []
    for i in range(count()):
        u = uuid_of(torch.device("cuda", i))
        if u == uuid:
            return i
        seen.append(str(u))
    raise ValueError(f"GPU {uuid} is not visible in this process (it sees {', '.join(seen) or 'no GPU'}; check "
                     "CUDA_VISIBLE_DEVICES): a reader maps a slab on the GPU that holds it")


def handle_of(args: tuple, uuid: str, round_event: bytes) -> CudaHandle:
    """A :class:`CudaHandle` from ``reduce_tensor``'s arguments of a 1-D ``uint8`` CUDA slab."""
    (_tcls, _size, _stride, _toff, _scls, _dtype, _device, storage_handle, storage_size_bytes, storage_offset_bytes,
     _grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync_required) = args
    return CudaHandle(
        device=uuid, storage_handle=bytes(storage_handle).hex(), storage_size_bytes=int(storage_size_bytes),
        storage_offset_bytes=int(storage_offset_bytes), ref_counter_handle=bytes(ref_counter_handle).hex(),
        ref_counter_offset=int(ref_counter_offset), event_handle=bytes(event_handle or b"").hex(),
        event_sync_required=bool(event_sync_required), round_event=bytes(round_event).hex(),
    )


def rebuild_args(h: CudaHandle, nbytes: int, index: int) -> tuple:
    """The arguments of ``rebuild_cuda_tensor`` for a slab of ``nbytes`` on local device ``index``: fixed
    classes (``torch.Tensor``, ``TypedStorage``, ``uint8``), the handles decoded from hex."""
    if not 0 < nbytes <= h.storage_size_bytes:
        raise ValueError(f"a {nbytes}-byte slab does not fit the shared allocation of {h.storage_size_bytes} bytes")
    try:
        ref = bytes.fromhex(h.ref_counter_handle)
    except ValueError as exc:
        raise ValueError(f"the slab's reference counter handle is not hex: {exc}") from None
    return (torch.Tensor, (nbytes,), (1,), 0, torch.storage.TypedStorage, torch.uint8, index,
            bytes.fromhex(h.storage_handle), h.storage_size_bytes, h.storage_offset_bytes, False, ref,
            h.ref_counter_offset, bytes.fromhex(h.event_handle) or None, h.event_sync_required)


@dataclass
class ExportedSlab:
    """The sender's slab and what readers need to open it; ``record()`` after packing each round."""

    tensor: torch.Tensor
    handle: CudaHandle
    event: Any
    device: torch.device

    def record(self) -> None:
        self.event.record(torch.cuda.current_stream(self.device))


@dataclass
class ImportedSlab:
    """A reader's mapping of a sender's slab (kept for the epoch); ``wait()`` before unpacking a round."""

    tensor: torch.Tensor
    event: Any

    def wait(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)


def export_slab(nbytes: int, device: torch.device) -> ExportedSlab:
    """Allocate and reduce the sender's slab of ``nbytes`` on ``device`` (once per epoch)."""
    from torch.multiprocessing.reductions import reduce_tensor

    from weightbridge.transport.identity import gpu_uuid

    uuid = gpu_uuid(device)
    if uuid is None:
        raise ValueError(f"{device} has no UUID in this torch build: transport ipc names devices by UUID")
    tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
    event = torch.cuda.Event(interprocess=True)
    event.record(torch.cuda.current_stream(device))  # an interprocess event has a handle once recorded
    _, args = reduce_tensor(tensor)
    return ExportedSlab(tensor, handle_of(args, uuid, event.ipc_handle()), event, device)


def import_slab(h: CudaHandle, nbytes: int) -> ImportedSlab:
    """Open a sender's slab on the local device its UUID names (once per epoch)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = device_index_of(h.device)
    tensor = rebuild_cuda_tensor(*rebuild_args(h, nbytes, index))
    event = torch.cuda.Event.from_ipc_handle(torch.device("cuda", index), bytes.fromhex(h.round_event))
    return ImportedSlab(tensor, event)
