"""Execute a :class:`~weightbridge.plan.types.TransferPlan` (or a rank's
:class:`~weightbridge.plan.types.RankPlan` slice of one) on one rank of the bridge group.

Every trainer rank and every rollout rank builds the same plan (or its slice of it), creates the
bridge group and runs an :class:`Executor` (reusable for every update of the same plan)::

    group = create_bridge_group(store, rank=..., world_size=S + R, num_trainers=S,
                                backend="gloo", timeout_s=60)
    ex = Executor(plan, group, side="trainer", rank=t, device=torch.device("cpu"))
    stats = ex.run(trainer_tensors)                       # trainer: pack + send
    ex = Executor(plan, group, side="rollout", rank=r, device=...)
    stats = ex.run(live_params)                           # rollout: receive into live params
    stats = ex.run(live_params, dst=staging)              # ... or into a staging dict

**Per round** (ranks without a bucket in a round skip it; P2P needs no barrier; the stages of one run
are :class:`~weightbridge.transport.pipeline.RoundPipeline`'s methods):

1. *pre*: one contiguous ``uint8`` wire buffer per bucket, sliced from the round's slab (the
   bucket's bytes, plus an 8-byte checksum trailer with ``checksums=True``). A bucket moves as
   messages (:func:`~weightbridge.transport.wire.split_items`): each item of at least
   ``direct_bytes`` as a message of its own, sent from / received into the tensor itself when its
   box is contiguous there at the wire dtype (zero-copy), else through the bucket's buffer; the
   smaller items packed back to back (:func:`~weightbridge.tensors.pack_items`: strided box copies,
   cast to the wire dtype) with the trailer, as one message after every direct message of the round
   (a round not packed ahead sends its direct messages while it packs the small items:
   :mod:`~weightbridge.transport.pipeline`);
2. *comm* (:class:`~weightbridge.transport.comm.RoundComm`): every message is cut into chunks of
   ``chunk_bytes`` (a pure function of the message size, so both ends of a pair cut identically).
   Gloo: every chunk of the round is issued at once (several in flight per pair), then waited for
   with the group's deadline. NCCL: wave ``k`` issues chunk ``k`` of every message as one coalesced
   batch (like ``dist.batch_isend_irecv``); wave ``k`` on a rank contains the send of a chunk iff
   wave ``k`` on the peer contains its receive, so batches stay bounded and symmetric and cannot
   deadlock, and every wave is issued before the round waits (once);
3. *post*: verify checksums (NCCL: computed on the device, a round's values fetched at once),
   unpack what arrived in the wire buffers into the destination
   (:func:`~weightbridge.tensors.unpack_items`, casts to the destination dtype), which
   releases the round's slab for round ``r+2``.

After the last round a rollout rank applies ``plan.local_copies`` to its destination.

**Wire buffers.** A rank's buffers of one round are slices of one contiguous ``uint8`` *slab*
sized for its largest round (never more than ``plan.round_bytes``, + 8 bytes per bucket with
checksums). With overlap there are two slabs used alternately (round ``i`` uses slab ``i % 2``),
without overlap one. With ``keep_buffers=True`` (default) the slabs stay allocated on the
executor between runs (no page faults / allocator calls per update; :meth:`Executor.release_buffers`
frees them); with ``False`` they are freed at the end of every run. Either way a rank's extra
memory stays within ``2 x plan.round_bytes``, reported as :attr:`ExecStats.peak_buffer_bytes`.

**Double buffering** (``overlap``):

* ``"inline"`` (the default, ``"auto"``): once round ``r`` is issued, the calling thread unpacks
  round ``r-1`` and packs round ``r+1`` into the slab that frees, then waits for round ``r``; round
  ``r+1`` is issued before round ``r`` is unpacked (:mod:`~weightbridge.transport.pipeline`). On Gloo
  the bytes move on Gloo's own I/O threads meanwhile; on CUDA the pack kernels run while NCCL transfers.
* ``"thread"``: the same order, with *pre* (pack) and *post* (unpack) on one background worker
  thread, FIFO (torch copies release the GIL). Best with spare CPU cores.

On CUDA every stage runs on the executor's own stream (both threads), ordered after what the caller
queued on its current stream when the run started, and the run returns once that stream is done
(:mod:`~weightbridge.transport.streams`).
* ``"off"``: strictly sequential (pack, transfer, unpack per round; one slab).

A rollout rank's exchange sends (``src_side == "rollout"``, receiver de-replication) read data
it received in earlier rounds, so for those rounds *pre* always waits for the previous round's
*post*. Measured with ``bench/transfer_gloo.py`` (270 MB, 6 processes on 2 CPU cores, so no
spare core to overlap with; 2026-12-03): inline 0.115-0.126 s, thread 0.12-0.14 s, off 0.12-0.13 s
per update, against 0.20-0.22 s before direct messages and one-wave rounds and 0.08-0.09 s for the
raw P2P bound; overlap pays where packing and moving bytes use different resources (GPU copy
engines vs NIC, spare cores).

**Delta updates** (``delta="on"`` / ``"auto"``, ``sync.delta``): each bucket's wire buffer gets a
64-byte header (version, the version a delta applies onto, length) and is sent as the elements that
changed since this executor's previous run when that is smaller
(:mod:`weightbridge.transport.delta`: encoded in *pre*, checked and applied in *post*). Wave 0 then
moves the first 4 KiB of every message (the header, with the message's length); a receiver cuts the
rest once it arrived, exactly as the sender did. Receivers raise
:class:`~weightbridge.transport.errors.DeltaBaseMismatch` for a delta computed against a version their
destination does not hold, :class:`~weightbridge.transport.errors.MalformedBucket` for bytes they
cannot read; any failed run drops the executor's delta state (the next run sends full buckets).

**Deadlines and errors.** Every wait is bounded by ``group.timeout_s``. A failure is raised as a
:class:`~weightbridge.transport.errors.TransportError` subclass naming this bridge rank, the peer
and the round: :class:`PeerTimeout` (deadline passed), :class:`PeerDisconnected` (connection closed,
backend error), :class:`ChecksumError`. After any of them the group is unusable: close it
(``group.close(abort=True)``) and re-create it.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from typing import Literal

import torch

from weightbridge._torch_compat import version_counter
from weightbridge.layout.box import in_bounds
from weightbridge.layout.ir import checkpoint_cast
from weightbridge.plan.types import ROLLOUT, TRAINER, Bucket, RankPlan, TransferPlan
from weightbridge.tensors import apply_local_copies
from weightbridge.tensors import dtype_name
from weightbridge.transport import delta as wd
from weightbridge.transport.errors import TransportError
from weightbridge.transport.group import BridgeGroup
from weightbridge.transport.pipeline import ExecStats, RoundPipeline
from weightbridge.plan.streaming import StreamSchedule, covered_tensors, stream_schedule
from weightbridge.transport.stream import StreamTarget, Write
from weightbridge.transport.streams import ExecStreams, stream_device
from weightbridge.transport.wire import CHECKSUM_BYTES, DIRECT_BYTES, chunk_bounds, split_items

Overlap = Literal["auto", "inline", "thread", "off"]

__all__ = ["ExecStats", "Executor", "Overlap", "chunk_bounds"]


class Executor:
    """Runs ``plan`` on one rank. Reusable: call :meth:`run` once per update (same plan).

    Parameters
    ----------
    plan : the plan every rank built (same ``plan_hash`` everywhere: the control plane checks it).
    group : the bridge group; ``group.rank`` must be this rank's bridge rank.
    side, rank : this process's side and rank within its side.
    device : the device of this rank's tensors; NCCL wire buffers live there (Gloo's on CPU).
    chunk_bytes : P2P chunk size; **must be equal on every rank** (it shapes the batches).
    checksums : append a checksum to every bucket and verify it on receipt; **equal on every rank**.
    overlap : ``"auto"`` (= ``"inline"``), ``"inline"``, ``"thread"`` or ``"off"`` (module docstring);
        ``True`` / ``False`` mean ``"thread"`` / ``"off"``. May differ between ranks.
    keep_buffers : keep the wire slabs allocated between runs (see :meth:`release_buffers`).
    direct_bytes : items of at least this many bytes move as messages of their own, sent from and
        received into the tensors themselves where their boxes are contiguous at the wire dtype
        (no pack or unpack copy); **equal on every rank** (it shapes the wire). Not with ``delta``.
    delta : ``"off"`` (default), ``"on"`` or ``"auto"``: send each bucket as the elements that changed
        since this executor's previous run when that is smaller (:mod:`weightbridge.transport.delta`);
        **equal on every rank** (it shapes the wire). Receivers then need destination dtypes equal to
        the wire dtypes (or wider floats, for checkpoint casts), and destinations that only the
        bridge writes between runs.
    """

    def __init__(
        self,
        plan: TransferPlan | RankPlan,
        group: BridgeGroup,
        *,
        side: Literal["trainer", "rollout"],
        rank: int,
        device: torch.device | str,
        chunk_bytes: int = 64 << 20,
        checksums: bool = False,
        overlap: Overlap | bool = "auto",
        keep_buffers: bool = True,
        delta: str = "off",
        direct_bytes: int = DIRECT_BYTES,
    ) -> None:
        if side not in (TRAINER, ROLLOUT):
            raise ValueError(f"side must be 'trainer' or 'rollout', got {side!r}")
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        if overlap is True:
            overlap = "thread"
        elif overlap is False:
            overlap = "off"
        elif overlap == "auto":
            overlap = "inline"
        if overlap not in ("inline", "thread", "off"):
            raise ValueError(f"overlap must be auto, inline, thread or off, got {overlap!r}")
        if direct_bytes <= 0:
            raise ValueError(f"direct_bytes must be positive, got {direct_bytes}")
        if delta not in wd.MODES:
            raise ValueError(f"delta must be off, auto or on, got {delta!r}")
        if plan.num_senders != group.num_trainers or plan.num_senders + plan.num_receivers != group.world_size:
            raise ValueError(
                f"plan is for {plan.num_senders} trainer + {plan.num_receivers} rollout ranks, but the bridge "
                f"group has {group.num_trainers} trainer ranks in a world of {group.world_size}"
            )
        me = group.bridge_rank(side, rank)
        if me != group.rank:
            raise ValueError(f"{side} rank {rank} is bridge rank {me}, but the group was created with rank {group.rank}")
        self.plan = plan
        self.group = group
        self.side = side
        self.rank = rank
        self.me = me
        self.device = torch.device(device)
        if group.backend == "nccl":
            self.wire_device = group.device if group.device is not None else self.device
        else:
            self.wire_device = torch.device("cpu")
        self.chunk_bytes = int(chunk_bytes)
        self.checksums = bool(checksums)
        self.overlap: str = overlap
        self.keep_buffers = bool(keep_buffers)
        self.trailer = CHECKSUM_BYTES if checksums else 0
        self.delta = delta
        self.header = wd.HEADER_BYTES if delta != "off" else 0
        # items this large move as messages of their own (zero-copy where the boxes allow; not with
        # delta, which encodes the whole bucket as one message)
        self.direct_bytes = int(direct_bytes)
        self._splits: dict[tuple, tuple[tuple, tuple, int]] = {}  # bucket key -> split_items(...) + packed bytes
        # sync.delta state (module docstring of transport.delta): per bucket of this rank, keyed by
        # (round, src_side, sender, receiver); dropped whenever a run fails.
        self._send: dict[tuple, wd.SendState] = {}
        self.held_versions: dict[tuple, int] = {}  # receiving: the version the destination holds for the bucket
        self._geo: dict[tuple, wd.Geometry] = {}
        self._marks: tuple | None = None  # the destination tensors after the last run (identity, version)
        self._runs = 0
        # (round index, sends, recvs) for the rounds this rank takes part in, in plan order.
        self.my_rounds: list[tuple[int, list[Bucket], list[Bucket]]] = []
        for rnd in plan.rounds:
            sends = [b for b in rnd.buckets if b.src_side == side and b.sender == rank]
            recvs = [b for b in rnd.buckets if side == ROLLOUT and b.receiver == rank]
            if sends or recvs:
                self.my_rounds.append((rnd.index, sends, recvs))
        self.local_copies = [c for c in plan.local_copies if side == ROLLOUT and c.rank == rank]
        self.slab_bytes = max(
            (sum(self.capacity(b) for b in sends + recvs) for _, sends, recvs in self.my_rounds), default=0
        )
        self._slabs: list[torch.Tensor | None] = [None, None]
        # CUDA: the run's own stream, ordered against the caller's by events (transport/streams.py)
        self.streams = ExecStreams(stream_device(self.wire_device, self.device))
        self._stream_caps: dict[tuple, int] = {}  # streaming receive: slab bytes per bucket (stream_capacity)
        self._stream_slab: int | None = None
        self._stream_plan: StreamSchedule | None = None

    # -- buffers ------------------------------------------------------------
    def capacity(self, b: Bucket) -> int:
        """Slab bytes of one bucket: its wire buffer (with ``delta``: header, rounded up to 8 bytes so
        every buffer and payload is aligned for integer views)."""
        if self.delta == "off":
            return b.nbytes + self.trailer
        return -(-(self.header + b.nbytes + self.trailer) // 8) * 8

    @staticmethod
    def bucket_key(round_index: int, b: Bucket) -> tuple:
        return (round_index, b.src_side, b.sender, b.receiver)

    def geometry(self, key: tuple, b: Bucket) -> wd.Geometry:
        geo = self._geo.get(key)
        if geo is None:
            geo = self._geo[key] = wd.geometry(b)
        return geo

    def split(self, key: tuple, b: Bucket) -> tuple[tuple, tuple, int]:
        """``(packed items, direct items, packed bytes)`` of bucket ``b`` (:func:`split_items`), computed
        once per bucket of the plan (every run cuts it the same)."""
        hit = self._splits.get(key)
        if hit is None:
            packed, direct = split_items(b.items, self.direct_bytes)
            hit = self._splits[key] = (packed, direct, sum(it.nbytes for it in packed))
        return hit

    def send_state(self, key: tuple) -> wd.SendState:
        st = self._send.get(key)
        if st is None:
            st = self._send[key] = wd.SendState()
        return st

    def drop_delta_state(self) -> None:
        """Forget what was sent and held (the next run sends full buckets; a delta arriving meanwhile
        raises ``DeltaBaseMismatch``)."""
        self._send.clear()
        self.held_versions.clear()
        self._marks = None

    def delta_cache_bytes(self) -> int:
        """Bytes this rank keeps of what it last sent (``delta``; 0 otherwise)."""
        return sum(st.cache.numel() for st in self._send.values() if st.cache is not None)

    def slab(self, i: int, nbytes: int | None = None) -> torch.Tensor:
        """Round ``i``'s slab; ``nbytes`` (a streaming run: :meth:`stream_slab_bytes`) means one slab of that size."""
        k = i % 2 if self.overlap != "off" and nbytes is None else 0
        need = self.slab_bytes if nbytes is None else nbytes
        slab = self._slabs[k]
        if slab is None or slab.numel() < need:
            self._slabs[k] = None  # freed before its successor is allocated
            slab = self._slabs[k] = torch.empty(need, dtype=torch.uint8, device=self.wire_device)
        return slab

    # -- streaming receive (transport.stream) ---------------------------------
    def stream_capacity(self, round_index: int, b: Bucket, shapes: Mapping[str, torch.Tensor]) -> int:
        """Slab bytes of receive bucket ``b`` in a streaming run: its packed items and trailer, and only
        those direct items that cannot land in the freshly allocated (contiguous) local tensor itself."""
        key = self.bucket_key(round_index, b)
        cap = self._stream_caps.get(key)
        if cap is None:
            _, direct, n = self.split(key, b)
            cap = n + self.trailer + sum(it.nbytes for it in direct if not self._lands_in_place(it, shapes))
            self._stream_caps[key] = cap
        return cap

    def _lands_in_place(self, it, shapes: Mapping[str, torch.Tensor]) -> bool:
        """Would :func:`~weightbridge.tensors.direct_view` give a view of the item's destination box?"""
        meta = shapes[it.dst_tensor]
        if it.dst_transpose or self.device != self.wire_device or dtype_name(meta.dtype) != it.dtype:
            return False
        region = torch.empty(tuple(meta.shape), dtype=meta.dtype, device="meta")[tuple(slice(a, b) for a, b in it.dst_box)]
        return region.is_contiguous()

    def stream_slab_bytes(self, shapes: Mapping[str, torch.Tensor]) -> int:
        """The slab of a streaming run: its largest round at :meth:`stream_capacity` (sends at :meth:`capacity`)."""
        if self._stream_slab is None:
            self._stream_slab = max(
                (sum(self.stream_capacity(r, b, shapes) for b in recvs) + sum(self.capacity(b) for b in sends)
                 for r, sends, recvs in self.my_rounds), default=0)
        return self._stream_slab

    def buffer_bytes(self) -> int:
        """Wire-buffer bytes currently allocated by this executor."""
        return sum(s.numel() for s in self._slabs if s is not None)

    def release_buffers(self) -> None:
        """Free the wire slabs (the next run allocates them again)."""
        self._slabs = [None, None]

    # -- bridge ranks -------------------------------------------------------
    def sender_bridge(self, b: Bucket) -> int:
        return self.group.bridge_rank(b.src_side, b.sender)

    def receiver_bridge(self, b: Bucket) -> int:
        return self.group.bridge_rank(ROLLOUT, b.receiver)

    # -- checks -------------------------------------------------------------
    def check_tensors(self, source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor] | None) -> None:
        """Raise ``ValueError`` (before any byte moves) when a tensor the plan names is missing or too small."""
        problems: list[str] = []

        def check(m: Mapping[str, torch.Tensor], name: str, box, role: str, wire: str | None = None) -> None:
            t = m.get(name)
            if t is None:
                problems.append(f"{role} tensor {name!r} missing")
            elif not in_bounds(box, tuple(t.shape)):
                problems.append(f"{role} tensor {name!r} of shape {list(t.shape)} does not contain box {list(box)}")
            elif wire is not None and dtype_name(t.dtype) != wire and checkpoint_cast(dtype_name(t.dtype), wire) != wire:
                problems.append(f"{role} tensor {name!r} is {dtype_name(t.dtype)} but its wire dtype is {wire} "
                                "(delta updates write single elements: the dtypes must be equal, or the wire's "
                                "a narrower float the tensor's values pass through)")

        for _, sends, recvs in self.my_rounds:
            for b in sends:
                for it in b.items:
                    check(source, it.src_tensor, it.src_box, "source")
            for b in recvs:
                for it in b.items:
                    check(target or {}, it.dst_tensor, it.dst_box, "destination",
                          it.dtype if self.delta != "off" else None)
            if len(problems) > 20:
                break
        for c in self.local_copies:
            check(target or {}, c.src_tensor, c.src_box, "local-copy source")
            check(target or {}, c.dst_tensor, c.dst_box, "local-copy destination")
        if problems:
            more = "" if len(problems) <= 10 else f" (+{len(problems) - 10} more)"
            raise ValueError(f"{self.side} rank {self.rank}: " + "; ".join(problems[:10]) + more)

    # -- run ----------------------------------------------------------------
    def run(
        self,
        tensors: Mapping[str, torch.Tensor],
        dst: Mapping[str, torch.Tensor] | None = None,
        *,
        on_round: Callable[[int, ExecStats], None] | None = None,
        version: int | None = None,
        stream: Write | None = None,
    ) -> ExecStats:
        """Move this rank's part of the update.

        Trainer: packs from ``tensors`` (its local tensors by IR name) and sends; ``dst`` is unused.
        Rollout: receives into ``dst`` when given (a staging dict) else into ``tensors`` (live
        parameters, in place); exchange buckets are sent from that same destination; finally
        ``plan.local_copies`` of this rank are applied to it. Destination elements no item
        covers (padding) are not written.
        ``on_round(round_index, stats)`` is called on the calling thread after each round's
        transfers completed (with ``overlap="thread"`` its unpack may still be running), with the
        executor's stream current on CUDA.
        ``version``: what this update is (``delta``: carried by every bucket, checked by the receiver,
        and the base of the next run's deltas); default: this executor's run count, which matches on
        every rank as long as every rank runs every update.
        ``stream`` (rollout, ``delta`` off): a streaming receive (:mod:`weightbridge.transport.stream`):
        ``tensors`` only give the local tensors' shapes and dtypes (meta tensors will do); each is
        allocated on ``device`` when its first bytes arrive, handed to ``stream(name, tensor)`` on the
        calling thread once complete (local copies included), and dropped; rounds are then not
        overlapped on this rank (one round in flight) and the slab is freed after the run.
        Raises :class:`TransportError` subclasses on communication failures (see module docstring),
        ``ValueError`` before any transfer when a named tensor is missing or too small.
        """
        if self.group.pg is None:
            raise self.group.error(TransportError, None, None, "the bridge group is closed")
        t0 = time.perf_counter()
        feed: StreamTarget | None = None
        if self.side == TRAINER:
            source, target = tensors, None
        else:
            target = dst if dst is not None else tensors
            source = target
        self.check_tensors(source, target)
        if stream is not None:
            if self.side != ROLLOUT or self.delta != "off":
                raise ValueError("a streaming receive is for rollout ranks without delta updates (a delta applies "
                                 "onto a version the destination holds; a streaming rank holds none)")
            if self._stream_plan is None:
                self._stream_plan = stream_schedule(self.my_rounds, self.local_copies)
                self._stream_covered = covered_tensors(self.my_rounds, self.local_copies,
                                                       {n: t.numel() for n, t in tensors.items()})
            feed = StreamTarget(tensors, self._stream_covered, self.device, self._stream_plan, stream)
            source = target = feed
        self._runs += 1
        version = self._runs if version is None else int(version)
        if self.delta != "off" and target is not None and self._marks != _marks(target, self._dst_names()):
            self.held_versions.clear()  # the destination was replaced or written by someone else: it holds nothing known
        self.streams.begin()
        try:
            with self.streams.use():
                if feed is not None:
                    feed.after_round(-1)  # local copies of tensors no round writes (none in practice)
                stats = RoundPipeline(self, source, target, version, feed).run(on_round)
                if feed is not None:
                    feed.finish()
                    stats.local_copies = len(self.local_copies)  # applied by the stream, as their sources completed
                    stats.stream_peak_bytes = feed.peak_bytes
                elif self.local_copies:
                    stats.local_copies = apply_local_copies(self.local_copies, target)  # type: ignore[arg-type]
        except BaseException as exc:
            if feed is not None:
                feed.drop()
            self.drop_delta_state()
            # The failed frames below hold the in-flight Work objects, which keep the Gloo context and
            # its sockets alive: a peer blocked on this rank would only give up at its deadline, since
            # Gloo's abort()/shutdown() close nothing. Drop them so group.close() really disconnects.
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            self.streams.end()  # CUDA: the caller's stream and the host wait for the run's work
        if self.delta != "off" and target is not None:
            self._marks = _marks(target, self._dst_names())
        stats.delta_cache_bytes = self.delta_cache_bytes()
        stats.seconds = time.perf_counter() - t0
        return stats

    def _dst_names(self) -> set[str]:
        names = {it.dst_tensor for _, _, recvs in self.my_rounds for b in recvs for it in b.items}
        return names | {c.dst_tensor for c in self.local_copies}


def _marks(target: Mapping[str, torch.Tensor], names: set[str]) -> tuple:
    """Which tensors ``target`` holds and whether they were written since (torch's in-place version
    counter; tensors created under inference mode have none: their identity only)."""
    out = []
    for name in sorted(names):
        t = target.get(name)
        if t is None:
            out.append((name, None))
            continue
        out.append((name, t.data_ptr(), tuple(t.shape), t.dtype, version_counter(t)))
    return tuple(out)
