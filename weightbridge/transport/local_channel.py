"""The colocated protocol of one epoch on one rank: its buckets with peers that share its memory.

**Slabs, once per epoch** (:meth:`LocalChannel._setup`, at the epoch's first push): each sender
exports one slab (:mod:`.local_slab`: a ``/dev/shm`` segment, or CUDA memory shared by IPC handle) of
two *regions*, each as large as the most it sends its local readers in one round, and publishes a
sealed :class:`~weightbridge.sync.local_records.SlabOffer` (name or handle, sizes, its readers). Each
reader maps the slabs it reads from, once, keeps the mapping for the epoch, and publishes
:class:`~weightbridge.sync.local_records.Mapped`; once all its readers mapped it the sender unlinks
the segment's name. A reader needs no slab of its own.

**Rounds.** Round ``r`` of the ``n``-th push of the epoch has sequence number ``g = n x rounds + r``
(both ends count it) and uses region ``g % 2``. The sender waits until the readers of that region's
previous use acknowledged it, packs each of its local buckets there (each item at a 64-byte aligned
offset: :func:`bucket_layout`), computes each bucket's digest (``sync.checksums``: the wire's
checksum), and publishes a :class:`~weightbridge.sync.local_records.RoundRecord` (version, round,
``g``, per bucket its receiver, offset, size and digest). A reader waits for the records of its
senders for ``g``, checks each bucket's place and size against its own plan, unpacks straight from
the mapping into its destination tensors (no receive buffer), then checks the digest of the slab
bytes (after the copy: a change made by anyone up to its end is caught; ``ChecksumError``, the
round is not acknowledged, a staged copy not staged, an in-place rank torn), and publishes a
:class:`~weightbridge.sync.local_records.RoundAck` of ``g``. While round ``r`` is unpacked the sender
already packs ``r + 1`` into the other region. A sender's run ends once its readers acknowledged
everything it packed.

Every wait is :meth:`~weightbridge.transport.local_io.RecordIO.wait`: the deadline, the epoch's
watch, and the peers' liveness locks. A failed run leaves the channel unusable (the epoch is broken;
the next push opens a new one); :meth:`LocalChannel.close` unmaps everything and unlinks this rank's name.
"""

from __future__ import annotations

import hmac
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from weightbridge.errors import ProtocolError
from weightbridge.plan.types import ROLLOUT, Bucket
from weightbridge.sync import local_records as lr
from weightbridge.tensors import pack_items, unpack_items
from weightbridge.transport.errors import ChecksumError, MalformedBucket, PeerDisconnected, TransportError
from weightbridge.transport.local_io import RecordIO
from weightbridge.transport.local_slab import ShmSlabs
from weightbridge.transport.peerauth import UnauthenticatedPeer
from weightbridge.transport.segment import SegmentError
from weightbridge.transport.wire import checksum

ALIGN = 64

__all__ = ["ALIGN", "LocalChannel", "LocalStats", "bucket_layout"]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def bucket_layout(items: Sequence[Any]) -> tuple[tuple[int, ...], int]:
    """Offsets of a bucket's items in a region (each at a multiple of :data:`ALIGN`) and its size there."""
    offsets, off = [], 0
    for it in items:
        offsets.append(off)
        off = _align(off + it.nbytes)
    return tuple(offsets), off


class LocalStats(NamedTuple):
    bytes_sent: int
    bytes_received: int
    slab_sent: int  # bytes written to the slab (alignment included)
    slab_received: int
    rounds: int


class _Part(NamedTuple):
    """This rank's local buckets of a plan, per round index: ``[(bucket, peer bridge rank)]`` each way."""

    sends: dict[int, list[tuple[Bucket, int]]]
    recvs: dict[int, list[tuple[Bucket, int]]]
    rounds: tuple[int, ...]  # the round indices with either, ascending
    num_rounds: int
    region: int  # the largest bytes this rank packs in one round
    readers: tuple[int, ...]
    senders: tuple[int, ...]


class LocalChannel:
    """The local pairs of one rank in one epoch (module docstring). ``local``: the bridge ranks whose
    buckets go through shared memory (both ends agree: they come from the epoch's identities)."""

    def __init__(self, io: RecordIO, *, prefix: str, local: frozenset[int], slabs: ShmSlabs, checksums: bool) -> None:
        self.io, self.prefix, self.local = io, prefix, local
        self.me = io.me
        self.slabs, self.checksums = slabs, checksums
        self.part: _Part | None = None
        self.plan_hash: str | None = None
        self.slab: torch.Tensor | None = None  # this rank's slab (a sender)
        self.remote: dict[int, tuple[torch.Tensor, int, int]] = {}  # sender -> (mapping, region bytes, size)
        self.uses: list[tuple[int, tuple[int, ...]] | None] = [None, None]  # region -> (seq, readers) last packed
        self.runs = 0
        self.broken = False
        self._lock = threading.Lock()
        self._running = False
        self._closing = False

    # -- the data-sender check --------------------------------------------------------------------
    def authenticate(self, peers: Sequence[int], token: Callable[[int, int], bytes]) -> float:
        """Exchange tokens with the local ``peers`` through sealed records (what the wire's check sends over
        its sockets); ``UnauthenticatedPeer`` when one does not verify."""
        t0 = time.perf_counter()
        peers = sorted(set(peers) - {self.me})
        if not peers:
            return 0.0
        io = self.io
        io.put(lr.auth_key(self.prefix, self.me), lr.LocalAuth(src=self.me, tokens={p: token(self.me, p).hex()
                                                                                   for p in peers}))
        for p in peers:
            key = lr.auth_key(self.prefix, p)
            got = io.wait(lambda key=key, p=p: _auth_of(io.get(key, lr.LocalAuth), p, self.me),
                          what="the data-sender check", peers=[p], round_index=None, keys=[key])
            if not hmac.compare_digest(got, token(p, self.me).hex()):
                raise io.error(UnauthenticatedPeer, p, None,
                               f"{io.describe(p)} did not prove the job secret for this epoch; no data is taken from it")
        return time.perf_counter() - t0

    # -- one push --------------------------------------------------------------------------------
    def run(self, plan: Any, *, side: str, rank: int, tensors: Mapping[str, torch.Tensor],
            dst: Mapping[str, torch.Tensor] | None, version: int,
            on_round: Callable[[int], None] | None = None) -> LocalStats:
        """Move this rank's local buckets of ``plan`` (a trainer: from ``tensors``; a rollout rank: into
        ``dst``, exchange sends read from it too). Typed :class:`TransportError` on any failure."""
        with self._lock:
            if self._closing or self.broken:
                raise self.io.error(TransportError, None, None, "the colocated data plane of this epoch is closed")
            self._running = True
        try:
            with torch.no_grad():
                return self._run(plan, side, rank, tensors, dst, version, on_round)
        except BaseException as exc:
            self.broken = True
            traceback.clear_frames(exc.__traceback__)  # frames holding views of the mappings
            raise
        finally:
            with self._lock:
                self._running = False
                closing = self._closing
            if closing:
                self._release()

    def _run(self, plan, side, rank, tensors, dst, version, on_round) -> LocalStats:
        part = self._part(plan, side, rank)
        if self.runs == 0:
            self._setup(part)
        target = dst if dst is not None else tensors
        source = tensors if side != ROLLOUT else target
        sent = received = slab_sent = slab_received = 0
        base = self.runs * part.num_rounds
        for ridx in part.rounds:
            g = base + ridx
            sends, recvs = part.sends.get(ridx, ()), part.recvs.get(ridx, ())
            if sends:
                slab_sent += self._send(g, ridx, sends, source, version)
                sent += sum(b.nbytes for b, _ in sends)
            if recvs:
                slab_received += self._receive(g, ridx, recvs, target, version)  # type: ignore[arg-type]
                received += sum(b.nbytes for b, _ in recvs)
            if on_round is not None:
                on_round(ridx)
        self._drain()
        self.runs += 1
        return LocalStats(sent, received, slab_sent, slab_received, len(part.rounds))

    def _part(self, plan: Any, side: str, rank: int) -> _Part:
        if self.part is not None:
            if plan.plan_hash != self.plan_hash:
                raise ProtocolError(self.io.describe(self.me), "the plan changed within an epoch")
            return self.part
        bridge = self.io.roster.bridge_of_plan
        sends: dict[int, list] = {}
        recvs: dict[int, list] = {}
        for rnd in plan.rounds:
            for b in rnd.buckets:
                if b.src_side == side and b.sender == rank:
                    peer = bridge(ROLLOUT, b.receiver)
                    if peer in self.local:
                        sends.setdefault(rnd.index, []).append((b, peer))
                if side == ROLLOUT and b.receiver == rank:
                    peer = bridge(b.src_side, b.sender)
                    if peer in self.local:
                        recvs.setdefault(rnd.index, []).append((b, peer))
        region = max((sum(bucket_layout(b.items)[1] for b, _ in v) for v in sends.values()), default=0)
        self.part = _Part(sends, recvs, tuple(sorted(set(sends) | set(recvs))), len(plan.rounds), region,
                          tuple(sorted({p for v in sends.values() for _, p in v})),
                          tuple(sorted({p for v in recvs.values() for _, p in v})))
        self.plan_hash = plan.plan_hash
        return self.part

    # -- slabs, once per epoch ---------------------------------------------------------------------
    def _setup(self, part: _Part) -> None:
        io, prefix = self.io, self.prefix
        self.slabs.clean()
        if part.region:
            try:
                fields, self.slab = self.slabs.export(2 * part.region)
            except (SegmentError, ValueError) as exc:
                raise io.error(TransportError, None, None, f"exporting this rank's slab: {exc}") from None
            io.put(lr.slab_key(prefix, self.me), lr.SlabOffer(sender=self.me, region=part.region,
                                                              readers=part.readers, **fields))
        for s in part.senders:
            key = lr.slab_key(prefix, s)
            offer = io.wait(lambda key=key, s=s: _offer_for(io.get(key, lr.SlabOffer), s, self.me),
                            what="the slab of the epoch", peers=[s], round_index=None, keys=[key])
            try:
                tensor = self.slabs.open(offer, offer.readers.index(self.me))
            except (SegmentError, ValueError) as exc:
                cls = UnauthenticatedPeer if getattr(exc, "refused", False) else PeerDisconnected
                raise io.error(cls, s, None, f"mapping the slab of {io.describe(s)}: {exc}") from None
            self.remote[s] = (tensor, offer.region, offer.size)
        if part.senders:
            io.put(lr.mapped_key(prefix, self.me), lr.Mapped(reader=self.me, senders=part.senders))
        for r in part.readers:
            key = lr.mapped_key(prefix, r)
            # no liveness check yet: a reader takes its lock as it maps (the epoch's watch sees a dead one)
            io.wait(lambda key=key: _mapped_by(io.get(key, lr.Mapped), self.me), what="readers mapping the slab",
                    peers=[r], round_index=None, keys=[key])
        self.slabs.unlink()  # every reader maps it: nothing in /dev/shm names it from now on

    def _reader_alive(self, peer: int) -> bool:
        return self.part is None or self.slabs.reader_alive(self.part.readers.index(peer))

    # -- sending -----------------------------------------------------------------------------------
    def _send(self, g: int, ridx: int, sends: list[tuple[Bucket, int]], source: Mapping[str, torch.Tensor],
              version: int) -> int:
        io, region = self.io, self.part.region  # type: ignore[union-attr]
        k = g % 2
        self._await_acks(k, ridx)
        slab = self.slab
        assert slab is not None
        base = k * region
        entries, off = [], 0
        for b, peer in sends:
            offsets, n = bucket_layout(b.items)
            view = slab[base + off: base + off + n]
            for it, o in zip(b.items, offsets):
                pack_items((it,), source, view, o)
            digest = checksum(view) if self.checksums else None
            entries.append(lr.BucketAt(receiver=peer, offset=off, nbytes=n, digest=digest))
            off += n
        self.slabs.published()
        io.put(lr.round_key(self.prefix, self.me, k),
               lr.RoundRecord(sender=self.me, version=version, round=ridx, seq=g, region=k, buckets=tuple(entries)))
        self.uses[k] = (g, tuple(sorted({p for _, p in sends})))
        return off

    def _await_acks(self, k: int, ridx: int | None) -> None:
        """Wait until the readers of region ``k``'s last use acknowledged it."""
        use = self.uses[k]
        if use is None:
            return
        seq, readers = use
        io = self.io
        for r in readers:
            key = lr.ack_key(self.prefix, r)
            io.wait(lambda key=key, r=r: _acked(io.get(key, lr.RoundAck), r, seq), what=f"the ack of round {seq}",
                    peers=[r], round_index=ridx, alive=self._reader_alive, keys=[key])
        self.uses[k] = None

    def _drain(self) -> None:
        for k in sorted(range(2), key=lambda k: self.uses[k][0] if self.uses[k] else -1):  # type: ignore[index]
            self._await_acks(k, None)

    # -- receiving ---------------------------------------------------------------------------------
    def _receive(self, g: int, ridx: int, recvs: list[tuple[Bucket, int]], target: Mapping[str, torch.Tensor],
                 version: int) -> int:
        io, k = self.io, g % 2
        pending = {peer: b for b, peer in recvs}
        keys = {peer: lr.round_key(self.prefix, peer, k) for peer in pending}
        nbytes = 0

        def ready() -> tuple[int, lr.RoundRecord] | None:
            for peer in pending:
                rec = io.get(keys[peer], lr.RoundRecord)
                if rec is not None and rec.sender == peer and rec.seq == g:
                    return peer, rec
            return None

        while pending:
            peer, rec = io.wait(ready, what=f"round {ridx} of version {version}", peers=sorted(pending),
                                round_index=ridx, alive=self.slabs.sender_alive, keys=list(keys.values()))
            nbytes += self._unpack(peer, pending.pop(peer), rec, k, ridx, target, version)
        self.slabs.consumed()
        io.put(lr.ack_key(self.prefix, self.me), lr.RoundAck(reader=self.me, seq=g, version=version))
        return nbytes

    def _unpack(self, peer: int, b: Bucket, rec: lr.RoundRecord, k: int, ridx: int,
                target: Mapping[str, torch.Tensor], version: int) -> int:
        io = self.io
        mapping, region, size = self.remote[peer]
        offsets, n = bucket_layout(b.items)
        mine = [e for e in rec.buckets if e.receiver == self.me]
        problem = None
        if rec.version != version or rec.round != ridx or rec.region != k:
            problem = f"carries version {rec.version}, round {rec.round}, region {rec.region}; expected {version}, " \
                      f"{ridx}, {k}"
        elif len(mine) != 1:
            problem = f"names this rank {len(mine)} times"
        elif mine[0].nbytes != n or mine[0].offset % ALIGN or mine[0].offset + n > region or 2 * region > size:
            problem = f"places this rank's {n}-byte bucket at [{mine[0].offset}, +{mine[0].nbytes}) of a {region}-byte region"
        if problem is not None:
            raise io.error(MalformedBucket, peer, ridx, f"the round record of {io.describe(peer)} {problem}")
        at = mine[0]
        if self.checksums and at.digest is None:
            raise io.error(MalformedBucket, peer, ridx, f"the round record of {io.describe(peer)} has no digest "
                           "although sync.checksums is on")
        self.slabs.consume(peer)
        view = mapping[k * region + at.offset: k * region + at.offset + n]
        for it, o in zip(b.items, offsets):
            unpack_items((it,), view, target, o)
        if self.checksums:
            # After the copy: whatever changed the slab since the sender's digest (anyone who could open it)
            # up to the end of this copy is caught, and the round is never acknowledged as received.
            got = checksum(view)
            if got != at.digest:
                raise io.error(ChecksumError, peer, ridx, f"bucket of {n} B from {io.describe(peer)}: checksum "
                               f"{got:#x} of the slab after the copy, its sender published {at.digest:#x}")
        return n

    # -- closing -----------------------------------------------------------------------------------
    def close(self, abort: bool = False) -> None:
        """Release every mapping and this rank's slab. From another thread while a run is in flight: its
        waits end at once and it releases them itself when it returns (nothing unmaps under a copy)."""
        self.io.stop.set()
        with self._lock:
            self._closing = True
            if self._running:
                return
        self._release()

    def _release(self) -> None:
        self.slab = None
        self.remote = {}
        self.slabs.close()


def _auth_of(rec: lr.LocalAuth | None, src: int, me: int) -> str | None:
    if rec is None or rec.src != src:
        return None
    return rec.tokens.get(me)


def _offer_for(rec: lr.SlabOffer | None, sender: int, me: int) -> lr.SlabOffer | None:
    return rec if rec is not None and rec.sender == sender and me in rec.readers else None


def _mapped_by(rec: lr.Mapped | None, sender: int) -> bool | None:
    return True if rec is not None and sender in rec.senders else None


def _acked(rec: lr.RoundAck | None, reader: int, seq: int) -> bool | None:
    return True if rec is not None and rec.reader == reader and rec.seq >= seq else None
