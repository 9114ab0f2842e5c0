"""One :meth:`Executor.run <weightbridge.transport.executor.Executor.run>` as a pipeline of round stages.

Per round ``i`` of the rank: :meth:`RoundPipeline.pre` (slice the round's slab into wire buffers,
pack and checksum the sends), the round's messages (:class:`~weightbridge.transport.comm.RoundComm`:
``start`` issues them, ``finish`` waits), then :meth:`RoundPipeline.post` (verify checksums, unpack
the receives, drop the buffers). ``pre`` and ``post`` run on the *worker*: the calling thread
(``overlap`` ``"inline"`` / ``"off"``) or one background thread (``"thread"``).

Order with overlap (two slabs, round ``i`` in slab ``i % 2``)::

    start(i) -> post(i-1) -> pre(i+1) -> finish(i) -> start(i+1) -> post(i) -> pre(i+2) -> ...

Round ``i + 1``'s receives are posted and its sends issued *before* round ``i`` is unpacked, so the
wire never waits for an unpack; ``pre(i + 1)`` writes the slab ``post(i - 1)`` just released (the
worker runs them in that order). A *dependent* round (a rollout rank's exchange sends read what
earlier rounds received) is packed only after the previous ``post``. Without overlap (one slab):
``pre(i) -> start(i) -> finish(i) -> post(i)``.

A round not packed ahead (the first, one after a dependent round, every round without overlap) on
Gloo without deltas, packed on the calling thread, splits ``pre`` around the wire:
``pre(i, defer_small=True)`` (wire buffers, direct messages: zero-copy views or packed large items)
-> ``start(i, hold_packed_sends=True)`` (every receive and direct send) -> ``pack_small(i)`` (the
small items and the checksum trailers) -> ``release()`` (the packed sends). A round's direct messages
precede its packed ones on every pair, so the large items move while the small ones are packed: with
one round (the default ``round_bytes`` of 1 GiB holds a small model's update) the whole pack was
otherwise spent before the first byte moved.

Tried and not kept (2026-12-03): two rounds on the wire at once (round ``i + 1`` started before
round ``i`` finished). ``bench/transfer_gloo.py`` showed no gain (0.115-0.118 s either way), and
after a failed round a bystander rank heard of the failure only at its deadline instead of at once
(tests/sync/test_heal_mp.py failed 3 runs of 3 with it, passed 2 of 2 without; not investigated further).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from weightbridge.errors import ProtocolError
from weightbridge.plan.types import ROLLOUT
from weightbridge.tensors import direct_view, pack_items, unpack_items
from weightbridge.transport import delta as wd
from weightbridge.transport.comm import RoundComm
from weightbridge.transport.errors import ChecksumError, DeltaBaseMismatch, MalformedBucket
from weightbridge.transport.stream import StreamTarget
from weightbridge.transport.wire import Transfer, bucket_sum, read_trailer, resolve, wire_buffer, write_trailer

if TYPE_CHECKING:
    from weightbridge.transport.run_context import RunContext


@dataclass
class ExecStats:
    """What one :meth:`Executor.run` did on one rank. Byte counts are payload (plan) bytes."""

    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0  # wall time of run()
    rounds: int = 0  # rounds this rank took part in
    peak_buffer_bytes: int = 0  # max wire-buffer bytes alive at once (<= 2 x round_bytes)
    round_seconds: list[float] = field(default_factory=list)  # per round taken part in: comm wall time
    round_indices: list[int] = field(default_factory=list)  # plan round index of each entry above
    pack_seconds: float = 0.0
    unpack_seconds: float = 0.0
    wait_seconds: float = 0.0  # main thread blocked on the worker (pack not ready / unpack not done)
    chunks: int = 0  # P2P ops issued
    zero_copy_bytes_sent: int = 0  # sent straight from the source tensors (no pack copy)
    zero_copy_bytes_received: int = 0  # received straight into the destination (no unpack copy)
    local_copies: int = 0
    wire_bytes_sent: int = 0  # bytes this rank put on the wire (headers, trailers, deltas: what moved)
    wire_bytes_received: int = 0
    # sync.delta (zero when off): buckets this rank sent as deltas / in full, elements compared and changed
    delta_buckets: int = 0
    full_buckets: int = 0
    compared_elements: int = 0
    changed_elements: int = 0
    encode_seconds: float = 0.0  # pack + compare + encode (part of pack_seconds)
    decode_seconds: float = 0.0  # checks + decode + writes (part of unpack_seconds)
    delta_cache_bytes: int = 0  # what this rank keeps of its last sends
    stream_peak_bytes: int = 0  # streaming receive: the most local-tensor bytes alive at once (0 otherwise)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Inline:
    """The worker interface, run on the calling thread (``overlap`` ``"inline"`` / ``"off"``)."""

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised by fut.result()
            fut.set_exception(exc)
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class _OnStream:
    """A background worker thread whose every task runs with the executor's stream current (CUDA)."""

    def __init__(self, ex: RunContext) -> None:
        init = None
        if ex.streams.device.type == "cuda":
            dev = ex.streams.device

            def init() -> None:
                torch.cuda.set_device(dev)

        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wb-pack", initializer=init)
        self.streams = ex.streams

    def _run(self, fn: Callable, *args: Any) -> Any:
        with self.streams.use():
            return fn(*args)

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        return self.pool.submit(self._run, fn, *args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _worker(ex: RunContext, rounds: int, streaming: bool = False) -> Any:
    if ex.overlap != "thread" or rounds == 0 or streaming:
        return _Inline()
    return _OnStream(ex)


class RoundPipeline:
    """The state of one run: the source and target tensors, the stats, the worker and its futures."""

    def __init__(self, ex: RunContext, source: Mapping[str, torch.Tensor],
                 target: Mapping[str, torch.Tensor] | None, version: int = 0, stream: StreamTarget | None = None) -> None:
        self.ex = ex
        self.version = version
        self.source = source
        self.target = target
        self.stream = stream
        self.stats = ExecStats()
        self.n = len(ex.my_rounds)
        # Rollout exchange sends read what earlier rounds received: pack them only after the previous unpack.
        self.dependent = [ex.side == ROLLOUT and bool(ex.my_rounds[i][1]) for i in range(self.n)]
        # Streaming: one round in flight, unpacked and handed to the engine on this thread before the
        # next round's receives are posted (what the rank holds stays one round, not two).
        self.ahead = ex.overlap != "off" and stream is None
        self.lock = threading.Lock()  # guards the stats the worker updates
        self.worker = _worker(ex, self.n, stream is not None)
        self.last_post: cf.Future | None = None  # the post of the previous round
        # NCCL: checksums computed on the device, one host synchronisation per round (wire.py)
        self.on_device = ex.group.backend == "nccl"

    def run(self, on_round: Callable[[int, ExecStats], None] | None) -> ExecStats:
        """Every round of the rank, in plan order (module docstring); frees the worker (and the
        slabs unless kept)."""
        ex, stats = self.ex, self.stats
        # A round not packed ahead (the first; each after a dependent round; all without overlap)
        # puts its direct messages on the wire first and packs its small items meanwhile. Gloo
        # without deltas, packing on this thread: NCCL's waves are symmetric batches of every
        # message, a delta's length is known only once it is encoded.
        split = ex.delta == "off" and ex.group.backend != "nccl" and isinstance(self.worker, _Inline)
        try:
            pending = self.worker.submit(self.pre, 0) if self.n and not split else None
            held: tuple[int, list[Transfer]] | None = None  # finished, unpacked once the next round is on the wire
            for i in range(self.n):
                if pending is None and split:
                    transfers = self.pre(i, defer_small=True)
                    comm = RoundComm(ex, ex.my_rounds[i][0], transfers)
                    t0 = time.perf_counter()
                    comm.start(hold_packed_sends=True)
                    self.pack_small(i, transfers)
                    comm.release()
                else:
                    if pending is None:
                        raise ProtocolError(ex.group.describe_rank(ex.me),
                                            f"round {ex.my_rounds[i][0]} was never packed")
                    tw = time.perf_counter()
                    transfers = pending.result()
                    stats.wait_seconds += time.perf_counter() - tw
                    comm = RoundComm(ex, ex.my_rounds[i][0], transfers)
                    t0 = time.perf_counter()
                    comm.start()
                pending = None
                if held is not None:  # unpack the previous round while this one moves
                    self.post_async(*held)
                    held = None
                ahead = self.ahead and i + 1 < self.n and not self.dependent[i + 1]
                if ahead:  # into the slab that unpack frees (the worker runs them in order)
                    pending = self.worker.submit(self.pre, i + 1)
                comm.finish()
                self.count(i, comm, time.perf_counter() - t0)
                if on_round is not None:
                    on_round(ex.my_rounds[i][0], stats)
                if ahead:
                    held = (i, transfers)
                else:  # no overlap, or the next round's sends read what this one received
                    self.post_async(i, transfers)
                    if i + 1 < self.n:
                        self.last_post.result()  # type: ignore[union-attr]
                        if not split:  # else packed at the top of the loop, around the wire
                            pending = self.worker.submit(self.pre, i + 1)
            if held is not None:
                self.post_async(*held)
            if self.last_post is not None:
                tw = time.perf_counter()
                self.last_post.result()
                stats.wait_seconds += time.perf_counter() - tw
        finally:
            self.worker.shutdown(wait=True, cancel_futures=True)
            stats.peak_buffer_bytes = ex.buffer_bytes()
            if self.stream is not None:
                stats.stream_peak_bytes = self.stream.peak_bytes
            if not ex.keep_buffers or self.stream is not None:  # a streaming rank keeps nothing between updates
                ex.release_buffers()
        return stats

    def count(self, i: int, comm: RoundComm, seconds: float) -> None:
        ex, stats = self.ex, self.stats
        ridx, sends, recvs = ex.my_rounds[i]
        stats.chunks += comm.issued
        stats.wire_bytes_sent += comm.sent
        stats.wire_bytes_received += comm.received
        stats.round_seconds.append(seconds)
        stats.round_indices.append(ridx)
        stats.rounds += 1
        stats.bytes_sent += sum(b.nbytes for b in sends)
        stats.bytes_received += sum(b.nbytes for b in recvs)

    def post_async(self, i: int, transfers: list[Transfer]) -> None:
        """Hand round ``i`` to ``post`` on the worker, after surfacing the previous post's failure."""
        if self.last_post is not None:
            self.last_post.result()
        self.last_post = self.worker.submit(self.post, i, transfers)

    def pre(self, i: int, *, defer_small: bool = False) -> list[Transfer]:
        """Round ``i``'s wire buffers (slices of its slab) and messages; the sends packed and checksummed
        (``defer_small``: all but the small items and the trailer, which :meth:`pack_small` adds)."""
        ex = self.ex
        ridx, sends, recvs = ex.my_rounds[i]
        ts = time.perf_counter()
        stream = self.stream
        slab = ex.slab(i, ex.stream_slab_bytes(stream.shapes) if stream is not None else None)
        out: list[Transfer] = []
        off = 0
        for b in recvs:
            tr = Transfer(b, ex.sender_bridge(b), False, ex.header + b.nbytes + ex.trailer)
            cap = ex.stream_capacity(ridx, b, stream.shapes) if stream is not None else ex.capacity(b)
            tr.buf = slab[off : off + min(cap, tr.nbytes)]
            off += cap
            if ex.delta == "off":
                self.messages(ridx, tr, self.target)
            out.append(tr)
        for b in sends:
            tr = Transfer(b, ex.receiver_bridge(b), True, ex.header + b.nbytes + ex.trailer)
            tr.buf = slab[off : off + tr.nbytes]
            off += ex.capacity(b)
            if ex.delta == "off":
                self.messages(ridx, tr, self.source)
                if not defer_small:
                    self.finish_send(ridx, tr)
            else:
                end = self.encode(ridx, b, tr.buf)
                tr.length = end + ex.trailer
                if ex.checksums:
                    write_trailer(tr.buf, end, bucket_sum([tr.buf[:end]], self.on_device))
            out.append(tr)
        with self.lock:
            self.stats.pack_seconds += time.perf_counter() - ts
        return out

    def pack_small(self, i: int, transfers: list[Transfer]) -> None:
        """Finish what ``pre(i, defer_small=True)`` left of each send (:meth:`finish_send`). Runs
        while the round's direct messages are on the wire."""
        ridx = self.ex.my_rounds[i][0]
        ts = time.perf_counter()
        for tr in transfers:
            if tr.send:
                self.finish_send(ridx, tr)
        with self.lock:
            self.stats.pack_seconds += time.perf_counter() - ts

    def finish_send(self, ridx: int, tr: Transfer) -> None:
        """Pack a send's small items into its packed message and write its checksum trailer (after
        :meth:`messages` cut it; delta off)."""
        ex = self.ex
        packed, _, n = ex.split(ex.bucket_key(ridx, tr.bucket), tr.bucket)
        buf = wire_buffer(tr, ex.group, ridx)
        if packed:
            pack_items(packed, self.source, buf)
        if ex.checksums:
            write_trailer(buf, n, self.checksum(tr))

    def messages(self, ridx: int, tr: Transfer, tensors: Mapping[str, torch.Tensor] | None) -> None:
        """Cut a bucket into its messages (:meth:`Executor.split`): each direct item as a view of the
        tensor itself when its box is one there, else as a region of the bucket's buffer (packed now,
        or unpacked in ``post``); and the packed message of the small items (a send's is packed later,
        by :meth:`finish_send`; a receive's is unpacked in ``post``)."""
        ex, buf, tensors = self.ex, wire_buffer(tr, self.ex.group, ridx), tensors or {}
        packed, direct, n = ex.split(ex.bucket_key(ridx, tr.bucket), tr.bucket)
        tr.packed = n
        if packed and not tr.send:
            tr.unpack.append((packed, 0))
        off = n + ex.trailer
        tr.packed_msg = buf[:off] if off else None
        tr.direct = []
        zero_copy = 0
        for it in direct:
            name, box, transpose = ((it.src_tensor, it.src_box, it.src_transpose) if tr.send
                                    else (it.dst_tensor, it.dst_box, it.dst_transpose))
            view = direct_view(tensors.get(name), box, transpose, it.dtype, ex.wire_device)
            if view is None:  # through the buffer (its regions back to back: only these take room)
                view = buf[off : off + it.nbytes]
                if tr.send:
                    pack_items((it,), tensors, view)
                else:
                    tr.unpack.append(((it,), off))
                off += it.nbytes
            else:
                zero_copy += it.nbytes
            tr.direct.append(view)
        if zero_copy:
            with self.lock:
                if tr.send:
                    self.stats.zero_copy_bytes_sent += zero_copy
                else:
                    self.stats.zero_copy_bytes_received += zero_copy

    def checksum(self, tr: Transfer) -> int | torch.Tensor:
        """The bucket's trailer value over what its messages carry (packed part, then direct items)."""
        buf = wire_buffer(tr, self.ex.group, -1)
        return bucket_sum([buf[: tr.packed]] + list(tr.direct), self.on_device)

    def verify(self, ridx: int, receives: list[Transfer]) -> None:
        """Compare every received bucket's trailer with its sum (on NCCL: all fetched at once, the round's
        one host synchronisation); :class:`ChecksumError` for the first that differs, before any unpack."""
        ex, values = self.ex, []
        for tr in receives:
            buf = wire_buffer(tr, ex.group, ridx)
            end = tr.packed if ex.delta == "off" else tr.header.length
            values += [read_trailer(buf, end), self.checksum(tr) if ex.delta == "off" else
                       bucket_sum([buf[:end]], self.on_device)]
        values = resolve(values)
        for k, tr in enumerate(receives):
            want, got = values[2 * k], values[2 * k + 1]
            if want != got:
                size = tr.bucket.nbytes if ex.delta == "off" else tr.header.length
                raise ex.group.error(ChecksumError, tr.peer, ridx, f"bucket of {size} B from "
                                     f"{ex.group.describe_rank(tr.peer)}: checksum {got:#x}, sender sent {want:#x}")

    def post(self, i: int, transfers: list[Transfer]) -> None:
        """Verify and unpack round ``i``'s receives into the target; release the round's buffers."""
        ex = self.ex
        ridx = ex.my_rounds[i][0]
        ts = time.perf_counter()
        try:
            receives = [tr for tr in transfers if not tr.send]
            if ex.checksums:
                self.verify(ridx, receives)
            for tr in receives:
                buf = wire_buffer(tr, ex.group, ridx)
                if ex.delta == "off":
                    for items, off in tr.unpack:
                        unpack_items(items, buf, self.target, off)  # type: ignore[arg-type]
                else:
                    self.decode(ridx, tr, buf)
            if self.stream is not None:  # local copies due, then every tensor now complete to the engine
                self.stream.after_round(i)
        finally:
            for tr in transfers:
                tr.buf = None
                tr.direct = []
                tr.packed_msg = None
            transfers.clear()
            with self.lock:
                self.stats.unpack_seconds += time.perf_counter() - ts

    # -- sync.delta ---------------------------------------------------------
    def encode(self, ridx: int, b, buf: torch.Tensor) -> int:
        """Pack send bucket ``b`` as a full bucket or a delta (:func:`weightbridge.transport.delta.encode_bucket`);
        returns the message length before the trailer."""
        ex = self.ex
        key = ex.bucket_key(ridx, b)
        t0 = time.perf_counter()
        enc = wd.encode_bucket(buf, b, ex.geometry(key, b), self.source, ex.send_state(key),
                               version=self.version, mode=ex.delta)
        with self.lock:
            st = self.stats
            st.encode_seconds += time.perf_counter() - t0
            if enc.kind == wd.DELTA:
                st.delta_buckets += 1
            else:
                st.full_buckets += 1
            if enc.changed >= 0:
                st.compared_elements += enc.elements
                st.changed_elements += enc.changed
        return enc.length

    def decode(self, ridx: int, tr: Transfer, buf: torch.Tensor) -> None:
        """Check a received message against this rank's state and write it into the target."""
        ex, h, b = self.ex, tr.header, tr.bucket
        key = ex.bucket_key(ridx, b)
        t0 = time.perf_counter()
        peer = ex.group.describe_rank(tr.peer)
        if h.version != self.version:
            raise ex.group.error(MalformedBucket, tr.peer, ridx,
                                 f"bucket from {peer} carries version {h.version}, this rank receives {self.version}")
        held = ex.held_versions.pop(key, None)  # while it is written the destination holds no known version
        if h.kind == wd.DELTA and held != h.base:
            raise ex.group.error(
                DeltaBaseMismatch, tr.peer, ridx,
                f"delta from {peer} applies onto version {h.base}, but this rank holds "
                f"{'no known version' if held is None else f'version {held}'} of those elements",
            )
        try:
            wd.decode_bucket(buf, b, ex.geometry(key, b), self.target, h)
        except ValueError as exc:
            raise ex.group.error(MalformedBucket, tr.peer, ridx, f"bucket from {peer}: {exc}") from None
        ex.held_versions[key] = self.version
        with self.lock:
            self.stats.decode_seconds += time.perf_counter() - t0
