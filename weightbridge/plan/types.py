"""The transfer plan as frozen, printable, hashable data.

Shape of a plan::

    TransferPlan
      rounds: (Round, ...)                    # executed in order, double-buffered
        Round.buckets: (Bucket, ...)          # sorted by (src_side, sender, receiver)
          Bucket: sender -> receiver, its items in wire order
            items: (WireItem, ...)            # packed back to back, in this order
      local_copies: (LocalCopy, ...)          # receiver-local duplicates, after the last round

**Wire format of a bucket.** The bucket of ``(round, sender, receiver)``'s bytes are
its items, each being the elements of its ``canonical_box`` in **canonical row-major
order**, at the item's ``dtype`` (``nbytes = numel(canonical_box) * itemsize(dtype)``, no
padding or alignment). The transport sends the small items concatenated in tuple order as
one message and each large item as a message of its own (``weightbridge.transport.wire``). The sender reads ``src_box`` of its local tensor ``src_tensor`` (dims
reversed first when ``src_transpose``), casts to ``dtype`` and copies it in; the
receiver does the inverse into ``dst_box`` of ``dst_tensor``.

**Dtype on the wire** is the receiver's local dtype: a cast, when needed, happens
at the sender (fp32 master -> bf16 rollout sends bf16 bytes). Except for the canonical tensors
of ``SideLayout.casts`` (a checkpoint dtype narrower than the receiver's): they move in the
checkpoint's dtype, so the receiver (casting up) holds the checkpoint-rounded values. A ``src_tensor``
named ``wb:quant:<canonical>`` is derived: the FP8 values or scales of whole blocks, which the sender
quantises from its own pieces (``weightbridge.quant``, ``docs/fp8.md``).

:class:`WireItem` has no ranks: one item object is shared by every bucket that
moves the same data (rollout instances with the same layout), which keeps a
DeepSeek-V3 plan small. :meth:`TransferPlan.items` yields the flat
:class:`TransferItem` view, one per (bucket, item), with sender and receiver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from weightbridge.layout.box import Box, format_box
from weightbridge.plan.hashing import plan_hash

TRAINER = "trainer"
ROLLOUT = "rollout"


class WireItem(NamedTuple):
    """One box on the wire; both local boxes hold exactly the elements of ``canonical_box``."""

    canonical: str  # canonical (HF) tensor name
    canonical_box: Box  # frame: canonical tensor; wire order is row-major over this box
    src_tensor: str  # sender's local tensor name
    src_box: Box  # frame: sender's local tensor
    src_transpose: bool  # src_box holds canonical_box with dims reversed
    dst_tensor: str  # receiver's local tensor name
    dst_box: Box  # frame: receiver's local tensor
    dst_transpose: bool  # dst_box holds canonical_box with dims reversed
    dtype: str  # element type on the wire (the receiver's local dtype, or its checkpoint cast)
    nbytes: int  # numel(canonical_box) * itemsize(dtype)

    def __str__(self) -> str:
        st = ".T" if self.src_transpose else ""
        dt = ".T" if self.dst_transpose else ""
        return (
            f"{self.canonical}{format_box(self.canonical_box)} {self.dtype} {self.nbytes}B: "
            f"{self.src_tensor}{format_box(self.src_box)}{st} -> {self.dst_tensor}{format_box(self.dst_box)}{dt}"
        )


class Bucket(NamedTuple):
    """Everything ``sender`` sends ``receiver`` in one round (its messages: module docstring)."""

    src_side: str  # "trainer" (update) or "rollout" (receiver de-replication exchange)
    sender: int  # rank within src_side
    receiver: int  # rollout rank
    items: tuple[WireItem, ...]  # packed in this order
    nbytes: int  # sum of item bytes = wire buffer size


class Round(NamedTuple):
    index: int
    buckets: tuple[Bucket, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


class TransferItem(NamedTuple):
    """Flat view of one item with its round and ranks (what :meth:`TransferPlan.items` yields)."""

    round: int
    src_side: str
    sender: int
    receiver: int
    canonical: str
    canonical_box: Box
    src_tensor: str
    src_box: Box
    src_transpose: bool
    dst_tensor: str
    dst_box: Box
    dst_transpose: bool
    dtype: str
    nbytes: int


class LocalCopy(NamedTuple):
    """After the last round, rollout rank ``rank`` copies one of its regions into another.

    Used when one receiver holds the same canonical elements twice (e.g. two local
    tensors built from one canonical tensor): they cross the wire once.
    """

    rank: int
    canonical: str
    canonical_box: Box  # frame: canonical tensor
    src_tensor: str
    src_box: Box  # frame: src_tensor (already received)
    src_transpose: bool
    dst_tensor: str
    dst_box: Box  # frame: dst_tensor
    dst_transpose: bool


class PlanProblem(NamedTuple):
    """One thing wrong with a plan. ``kind`` is a stable short code."""

    kind: str  # uncovered | duplicate | outside | dtype | bounds | unknown | mapping | round-cap | order | bytes
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True, eq=False)
class TransferPlan:
    """The plan of one weight update. Equality and hash go by :attr:`plan_hash`.

    ``plan_hash`` is computed from the other fields when the plan is made (also by
    ``dataclasses.replace``), never passed in: it covers the rounds, the local copies and every
    field up to ``min_wire_bytes``; ``max_sender_bytes_bound`` and ``notes`` describe the plan and
    are not hashed.
    """

    rounds: tuple[Round, ...]
    local_copies: tuple[LocalCopy, ...]
    round_bytes: int  # per-rank cap on wire bytes (sent + received) in any round
    num_senders: int  # trainer world size
    num_receivers: int  # rollout world size
    receiver_dedup: bool  # whether rollout instances complete shards among themselves
    min_wire_bytes: int  # sum over receivers of the bytes each needs
    max_sender_bytes_bound: int  # no plan of these layouts has a busiest sender below this
    notes: tuple[str, ...] = ()  # decisions worth printing (e.g. why receiver de-replication is off)
    plan_hash: str = field(init=False)  # sha256 hex of the content (weightbridge.plan.hashing)

    def __post_init__(self) -> None:
        header = (self.round_bytes, self.num_senders, self.num_receivers, self.receiver_dedup, self.min_wire_bytes)
        object.__setattr__(self, "plan_hash", plan_hash(header, self.rounds, self.local_copies))

    # -- views -------------------------------------------------------------
    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def wire_bytes(self) -> int:
        """Bytes arriving at rollout ranks, from trainers and (receiver de-replication) from peers.

        Equals :attr:`min_wire_bytes` for an exact plan: every needed element arrives once.
        """
        return sum(b.nbytes for r in self.rounds for b in r.buckets)

    @property
    def update_bytes(self) -> int:
        """Bytes sent by trainers."""
        return sum(b.nbytes for r in self.rounds for b in r.buckets if b.src_side == TRAINER)

    @property
    def exchange_bytes(self) -> int:
        return sum(b.nbytes for r in self.rounds for b in r.buckets if b.src_side == ROLLOUT)

    def buckets(self) -> Iterator[tuple[int, Bucket]]:
        for r in self.rounds:
            for b in r.buckets:
                yield r.index, b

    def items(self) -> Iterator[TransferItem]:
        """Every item with its round, sender and receiver, in wire order."""
        for r in self.rounds:
            for b in r.buckets:
                head = (r.index, b.src_side, b.sender, b.receiver)
                for it in b.items:
                    yield TransferItem(*head, *it)

    def num_items(self) -> int:
        return sum(len(b.items) for r in self.rounds for b in r.buckets)

    def sender_bytes(self, side: str = TRAINER) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rounds:
            for b in r.buckets:
                if b.src_side == side:
                    out[b.sender] = out.get(b.sender, 0) + b.nbytes
        return out

    def receiver_bytes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rounds:
            for b in r.buckets:
                out[b.receiver] = out.get(b.receiver, 0) + b.nbytes
        return out

    # -- identity ----------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferPlan) and other.plan_hash == self.plan_hash

    def __hash__(self) -> int:
        return hash(self.plan_hash)

    def __repr__(self) -> str:
        return (
            f"TransferPlan(hash={self.plan_hash}, rounds={self.num_rounds}, buckets="
            f"{sum(len(r.buckets) for r in self.rounds)}, wire_bytes={self.wire_bytes}, "
            f"min_wire_bytes={self.min_wire_bytes}, receiver_dedup={self.receiver_dedup})"
        )

    def __str__(self) -> str:
        return self.describe(max_items=20)

    def describe(self, max_items: int | None = None) -> str:
        """Human-readable listing: one line per bucket and item (truncated after ``max_items`` items)."""
        lines = [repr(self)]
        shown = 0
        for r in self.rounds:
            lines.append(f"round {r.index}: {len(r.buckets)} buckets, {r.nbytes} B")
            for b in r.buckets:
                lines.append(f"  {b.src_side} {b.sender} -> rollout {b.receiver}: {len(b.items)} items, {b.nbytes} B")
                for it in b.items:
                    if max_items is not None and shown >= max_items:
                        lines.append("  ...")
                        return "\n".join(lines)
                    lines.append(f"    {it}")
                    shown += 1
        for c in self.local_copies:
            lines.append(f"local copy on rollout {c.rank}: {c.canonical}{format_box(c.canonical_box)}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """Documented JSON form (boxes as ``[[start, stop], ...]``)."""

        def box(b: Box) -> list[list[int]]:
            return [list(iv) for iv in b]

        return {
            "plan_hash": self.plan_hash,
            "round_bytes": self.round_bytes,
            "receiver_dedup": self.receiver_dedup,
            "rounds": [
                [
                    {
                        "src_side": b.src_side,
                        "sender": b.sender,
                        "receiver": b.receiver,
                        "nbytes": b.nbytes,
                        "items": [
                            [it.canonical, box(it.canonical_box), it.src_tensor, box(it.src_box), it.src_transpose,
                             it.dst_tensor, box(it.dst_box), it.dst_transpose, it.dtype, it.nbytes]
                            for it in b.items
                        ],
                    }
                    for b in r.buckets
                ]
                for r in self.rounds
            ],
            "local_copies": [list(c) for c in self.local_copies],
        }


@dataclass(frozen=True, eq=False)
class RankPlan:
    """The slice of one update's plan that rank ``rank`` of ``side`` takes part in
    (:func:`weightbridge.plan.build_rank_plan`).

    ``rounds`` are all the plan's rounds, index for index, each holding only the buckets this
    rank sends or receives (often none); ``local_copies`` are this rank's. The remaining fields
    describe the whole plan (``wire_bytes`` included), as in :class:`TransferPlan`.
    ``plan_hash`` is the hash of the plan's *inputs* (planner version, layouts, arguments:
    :func:`weightbridge.plan.hashing.plan_inputs_hash`), equal on every rank of the update; the
    planner is deterministic, so equal inputs mean the slices are cut from one plan.
    """

    side: str
    rank: int
    rounds: tuple[Round, ...]
    local_copies: tuple[LocalCopy, ...]
    round_bytes: int
    num_senders: int
    num_receivers: int
    receiver_dedup: bool
    min_wire_bytes: int
    max_sender_bytes_bound: int
    wire_bytes: int  # of the whole plan
    notes: tuple[str, ...]
    plan_hash: str

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def buckets(self) -> Iterator[tuple[int, Bucket]]:
        for r in self.rounds:
            for b in r.buckets:
                yield r.index, b

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RankPlan) and (other.side, other.rank, other.plan_hash)
                == (self.side, self.rank, self.plan_hash))

    def __hash__(self) -> int:
        return hash((self.side, self.rank, self.plan_hash))

    def __repr__(self) -> str:
        return (f"RankPlan({self.side} {self.rank}, inputs={self.plan_hash[:12]}, rounds={self.num_rounds}, "
                f"buckets={sum(len(r.buckets) for r in self.rounds)})")


def rank_slice(plan: TransferPlan, side: str, rank: int) -> tuple[tuple[Round, ...], tuple[LocalCopy, ...]]:
    """The rounds (every index, only ``rank``'s buckets) and local copies of ``rank`` of ``side`` in
    ``plan``: what :func:`~weightbridge.plan.build_rank_plan` returns for that rank."""
    rounds = tuple(Round(r.index, tuple(b for b in r.buckets
                                        if (b.src_side == side and b.sender == rank)
                                        or (side == ROLLOUT and b.receiver == rank)))
                   for r in plan.rounds)
    return rounds, tuple(c for c in plan.local_copies if side == ROLLOUT and c.rank == rank)

