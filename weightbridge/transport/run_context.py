"""What one run's stages need of their executor: the seam between :class:`~weightbridge.transport.executor.Executor`
(one rank's part of a plan, kept across runs) and the run it drives (:mod:`.pipeline`'s round stages and
:mod:`.comm`'s messages of one round).

The executor owns the per-plan schedule (its rounds, slab sizes, bucket splits) and the state kept between
runs (wire slabs, ``sync.delta``'s sent and held versions); a run reads and updates them only through this
Protocol, which :class:`~weightbridge.transport.executor.Executor` implements. Declared here, below all three,
so that ``executor`` imports ``pipeline`` and ``comm`` and neither of them imports ``executor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from weightbridge.plan.types import Bucket
    from weightbridge.transport import delta as wd
    from weightbridge.transport.group import BridgeGroup
    from weightbridge.transport.streams import ExecStreams


class RunContext(Protocol):
    """One rank's executor as its runs see it. Sizes are bytes; a bucket ``key`` is :meth:`bucket_key`'s
    ``(round index, src side, sender, receiver)``; bridge ranks are the group's (not spec ranks)."""

    # the plan's schedule for this rank (fixed for the executor's life)
    group: BridgeGroup
    side: str
    me: str  # this rank as errors name it
    my_rounds: list[tuple[int, list[Bucket], list[Bucket]]]  # (round index, sends, recvs), plan order
    delta: str  # sync.delta: "off" or a codec
    chunk_bytes: int
    checksums: bool
    header: int  # delta header bytes per message (0 without delta)
    trailer: int  # checksum bytes per message (0 without checksums)
    overlap: str
    keep_buffers: bool
    wire_device: torch.device
    streams: ExecStreams
    # receiving with delta: the version the destination holds per bucket key (a run pops it while writing)
    held_versions: dict[tuple, int]

    @staticmethod
    def bucket_key(round_index: int, b: Bucket) -> tuple: ...

    def capacity(self, b: Bucket) -> int: ...

    def geometry(self, key: tuple, b: Bucket) -> wd.Geometry: ...

    def split(self, key: tuple, b: Bucket) -> tuple[tuple, tuple, int]: ...

    def send_state(self, key: tuple) -> wd.SendState: ...

    def slab(self, i: int, nbytes: int | None = None) -> torch.Tensor: ...

    def stream_capacity(self, round_index: int, b: Bucket, shapes: Mapping[str, torch.Tensor]) -> int: ...

    def stream_slab_bytes(self, shapes: Mapping[str, torch.Tensor]) -> int: ...

    def buffer_bytes(self) -> int: ...

    def release_buffers(self) -> None: ...

    def sender_bridge(self, b: Bucket) -> int: ...

    def receiver_bridge(self, b: Bucket) -> int: ...
