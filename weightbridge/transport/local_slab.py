"""Where a colocated sender's slab lives: a ``/dev/shm`` segment (CPU) or CUDA memory shared by IPC handle.

:class:`ShmSlabs` and :class:`CudaSlabs` give :class:`~weightbridge.transport.local_channel.LocalChannel`
the same five operations: ``export`` (the sender's slab, once per epoch: the record fields readers
need and the slab as a ``uint8`` tensor), ``unlink`` (once every reader mapped it), ``open`` (a
reader maps a sender's slab, once per epoch, cached), ``sender_alive`` / ``reader_alive`` (liveness
through the segment's locks: :mod:`weightbridge.transport.segment`) and ``close``. The CUDA kind keeps
a one-page segment per sender for liveness and cleanup only; its bytes are a CUDA allocation
(:mod:`weightbridge.transport.cuda_ipc`), ordered by an interprocess event per round
(``published`` / ``consume`` / ``consumed``).
"""

from __future__ import annotations

from typing import Any

import torch

from weightbridge.sync.local_records import SlabOffer
from weightbridge.transport.segment import PAGE, SHM_DIR, Segment, remove_stale

__all__ = ["CudaSlabs", "ShmSlabs", "slabs_for"]


class ShmSlabs:
    """Slabs in ``/dev/shm`` segments (``sync.transport: shm``): the reader's tensor is its read-only mapping."""

    kind = "shm"

    def __init__(self, tag: str, directory: str = SHM_DIR) -> None:
        self.tag, self.directory = tag, directory
        self.own: Segment | None = None  # this rank's slab (a sender)
        self.maps: dict[int, Segment] = {}  # sender bridge rank -> its segment, mapped read-only

    def clean(self) -> list[str]:
        """Remove this job's names left by processes killed while setting up (:func:`remove_stale`)."""
        keep = frozenset([self.own.name] if self.own is not None else [])
        return remove_stale(self.tag, self.directory, keep=keep)

    def export(self, nbytes: int) -> tuple[dict[str, Any], torch.Tensor]:
        self.own = Segment.create(self.tag, nbytes, self.directory)
        return {"name": self.own.name, "size": self.own.size}, self.own.tensor  # type: ignore[return-value]

    def unlink(self) -> None:
        if self.own is not None:
            self.own.unlink()

    def open(self, offer: SlabOffer, slot: int) -> torch.Tensor:
        seg = self.maps.get(offer.sender)
        if seg is None:
            seg = self.maps[offer.sender] = Segment.open(offer.name, offer.size, slot, self.directory)
        return seg.tensor  # type: ignore[return-value]

    def sender_alive(self, sender: int) -> bool:
        seg = self.maps.get(sender)
        return seg is None or seg.creator_alive()

    def reader_alive(self, slot: int) -> bool:
        return self.own is None or self.own.reader_alive(slot)

    # CPU bytes are ordered by the control store's round trip: nothing to record or wait for.
    def published(self) -> dict[str, Any]:
        return {}

    def consume(self, sender: int) -> None:
        pass

    def consumed(self) -> None:
        pass

    def close(self) -> None:
        """Unmap every slab and drop this rank's own (its name first)."""
        for seg in self.maps.values():
            seg.close()
        self.maps = {}
        if self.own is not None:
            self.own.close()
            self.own = None


class CudaSlabs(ShmSlabs):
    """CUDA slabs shared by ``torch.multiprocessing`` reductions (``sync.transport: ipc``): one allocation
    per sender, opened once per epoch by each reader on the device its UUID names; a one-page segment
    per sender carries the liveness locks."""

    kind = "ipc"

    def __init__(self, tag: str, device: torch.device, directory: str = SHM_DIR) -> None:
        super().__init__(tag, directory)
        self.device = device
        self.slab: Any = None  # cuda_ipc.ExportedSlab
        self.remote: dict[int, Any] = {}  # sender -> cuda_ipc.ImportedSlab

    def export(self, nbytes: int) -> tuple[dict[str, Any], torch.Tensor]:
        from weightbridge.transport.cuda_ipc import export_slab

        fields, _ = super().export(1)  # the liveness page
        self.slab = export_slab(nbytes, self.device)
        return {**fields, "size": nbytes, "cuda": self.slab.handle}, self.slab.tensor

    def open(self, offer: SlabOffer, slot: int) -> torch.Tensor:
        from weightbridge.transport.cuda_ipc import import_slab

        if offer.sender not in self.maps:
            self.maps[offer.sender] = Segment.open(offer.name, PAGE, slot, self.directory)
        got = self.remote.get(offer.sender)
        if got is None:
            if offer.cuda is None:
                raise ValueError(f"the slab of bridge rank {offer.sender} carries no CUDA handle")
            got = self.remote[offer.sender] = import_slab(offer.cuda, offer.size)
        return got.tensor

    def published(self) -> dict[str, Any]:
        """The sender, after packing a round on its stream: record the round's event (no host wait)."""
        self.slab.record()
        return {}

    def consume(self, sender: int) -> None:
        """A reader, before unpacking a sender's round: its stream waits for that sender's event."""
        self.remote[sender].wait()

    def consumed(self) -> None:
        """A reader, after unpacking a round: the copies are done before it acknowledges (the sender
        may then overwrite the region)."""
        torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        self.remote = {}
        self.slab = None
        super().close()


def slabs_for(kind: str, tag: str, device: torch.device, directory: str = SHM_DIR) -> ShmSlabs:
    return CudaSlabs(tag, device, directory) if kind == "ipc" else ShmSlabs(tag, directory)
