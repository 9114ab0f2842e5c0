"""What the colocated data plane publishes on the control store: typed JSON records, sealed, and their keys.

Pure (pydantic, no torch). Every record is written ``MAC || stamp || body`` with the job secret
(:class:`~weightbridge.sync.auth.Signer`, over the full key), so a process without the secret can
neither point a reader at memory of its own nor make it take a round that was never packed: a
value that does not open is ignored while waiting (the genuine one replaces it; a store keyed by
the secret never lets it displace one), and its key named when the wait ends. Keys, under the
epoch's group prefix ``G`` (``P/e{E}/pg``), one set per bridge rank ``b``:

=====================  ==========================  ============================================================
key                    record                      written by / when
=====================  ==========================  ============================================================
``G/shm/auth/b``       :class:`LocalAuth`          every member with local peers, once per epoch: the
                                                   data-sender token to each local peer
``G/shm/slab/b``       :class:`SlabOffer`          a sender, at its first push of the epoch: its slab (a
                                                   segment name, or a CUDA IPC handle), size, readers
``G/shm/mapped/b``     :class:`Mapped`             a reader, once it mapped every slab it reads
``G/shm/round/b/k``    :class:`RoundRecord`        a sender, per round it sends: region ``k`` (0 or 1) holds
                                                   it; per bucket its receiver, offset, size and digest
``G/shm/ack/b``        :class:`RoundAck`           a reader, after unpacking each round: the highest
                                                   sequence number it consumed
=====================  ==========================  ============================================================

Trainer 0 deletes an old epoch's keys with the rest of it (:func:`record_keys`).
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

MAX_RECORD_BYTES = 1 << 20
_HEX = r"^[0-9a-f]*$"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalAuth(_Record):
    """Bridge rank ``src``'s data-sender tokens (hex) to its local peers, by bridge rank."""

    kind: Literal["shm-auth"] = "shm-auth"
    src: int
    tokens: dict[int, str]


class CudaHandle(_Record):
    """A CUDA slab as ``torch.multiprocessing`` reduces it, as data: the device by UUID (readers number
    devices differently), the IPC handles as hex, and the slab's interprocess event."""

    device: str  # GPU UUID
    storage_handle: str = Field(pattern=_HEX, max_length=512)
    storage_size_bytes: int = Field(ge=0)
    storage_offset_bytes: int = Field(ge=0)
    ref_counter_handle: str = Field(pattern=_HEX, max_length=512)
    ref_counter_offset: int = Field(ge=0)
    event_handle: str = Field(pattern=_HEX, max_length=512)
    event_sync_required: bool
    round_event: str = Field(pattern=_HEX, max_length=512)  # the sender's per-round interprocess event


class SlabOffer(_Record):
    """Sender ``sender``'s slab of the epoch: two regions of ``region`` bytes each (``size`` in all) read by
    ``readers`` (bridge ranks; reader ``i`` locks byte ``1 + i`` of a segment). ``name``: the segment
    in ``/dev/shm`` (``transport: shm``); ``cuda``: the CUDA IPC handle (``ipc``)."""

    kind: Literal["shm-slab"] = "shm-slab"
    sender: int
    size: int = Field(gt=0)
    region: int = Field(gt=0)
    readers: tuple[int, ...]
    name: str = Field(default="", max_length=64)
    cuda: CudaHandle | None = None


class Mapped(_Record):
    """Reader ``reader`` mapped the slabs of ``senders`` (it has taken its liveness lock on each)."""

    kind: Literal["shm-mapped"] = "shm-mapped"
    reader: int
    senders: tuple[int, ...]


class BucketAt(_Record):
    """Where one bucket of a round is in its region, and the digest of its bytes (None: checksums off)."""

    receiver: int
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    digest: int | None = None


class RoundRecord(_Record):
    """Sender ``sender`` packed ``round`` of version ``version`` into region ``region``. ``seq`` is the
    round's sequence number in the epoch (run number x rounds + round index: both ends count it)."""

    kind: Literal["shm-round"] = "shm-round"
    sender: int
    version: int
    round: int
    seq: int
    region: int = Field(ge=0, le=1)
    buckets: tuple[BucketAt, ...]


class RoundAck(_Record):
    """Reader ``reader`` has unpacked every round up to sequence number ``seq`` (version ``version``)."""

    kind: Literal["shm-ack"] = "shm-ack"
    reader: int
    seq: int
    version: int


R = TypeVar("R", bound=_Record)


def auth_key(prefix: str, b: int) -> str:
    return f"{prefix}/shm/auth/{b}"


def slab_key(prefix: str, b: int) -> str:
    return f"{prefix}/shm/slab/{b}"


def mapped_key(prefix: str, b: int) -> str:
    return f"{prefix}/shm/mapped/{b}"


def round_key(prefix: str, b: int, region: int) -> str:
    return f"{prefix}/shm/round/{b}/{region}"


def ack_key(prefix: str, b: int) -> str:
    return f"{prefix}/shm/ack/{b}"


def record_keys(prefix: str, world_size: int) -> list[str]:
    """Every key the colocated data plane may write under group prefix ``prefix`` (to delete an epoch)."""
    out = []
    for b in range(world_size):
        out += [auth_key(prefix, b), slab_key(prefix, b), mapped_key(prefix, b), ack_key(prefix, b),
                round_key(prefix, b, 0), round_key(prefix, b, 1)]
    return out


def decode_record(body: bytes, cls: type[R]) -> R:
    """``body`` as a ``cls``; ``ValueError`` for anything else (oversized, garbage, another kind)."""
    if len(body) > MAX_RECORD_BYTES:
        raise ValueError(f"a {len(body)}-byte value is not a {cls.__name__} (limit {MAX_RECORD_BYTES})")
    return cls.model_validate_json(body)


__all__ = ["BucketAt", "CudaHandle", "LocalAuth", "Mapped", "RoundAck", "RoundRecord", "SlabOffer", "ack_key",
           "auth_key", "decode_record", "mapped_key", "record_keys", "round_key", "slab_key"]
