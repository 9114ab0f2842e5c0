"""Delta updates (``sync.delta``): per planned bucket, send only the elements that changed.

Runs inside the data plane, per bucket (:mod:`weightbridge.transport.pipeline` calls
:func:`encode_bucket` in a round's *pre* stage and :func:`decode_bucket` in its *post* stage), so
the planner, rounds, memory bounds and the engines' reload paths are unchanged.

**Wire format** with ``sync.delta`` ``on`` or ``auto`` (with ``off`` nothing here runs and buckets
are the bare payload of :mod:`weightbridge.plan.types`): every bucket starts with a
:data:`HEADER_BYTES` header (:class:`Header`: kind, codes, ``version``, ``base``, length, counts,
a CRC-32 of the header itself), then either the full payload (kind ``FULL``, ``length =
HEADER_BYTES + bucket.nbytes``) or a delta (kind ``DELTA``: positions, then values; see
:mod:`weightbridge.transport.deltacode`), then the checksum trailer over ``[0, length)`` when
``sync.checksums``. A delta is sent only when it is smaller than the full bucket, so a message never
exceeds the planned wire buffer (``HEADER_BYTES + nbytes + trailer``).

**Exactness.** A sender keeps, per bucket, the payload it last sent (in the wire dtype: the
receiver's, or a narrower checkpoint dtype its values pass through, read back exactly from the
wider destination) and the version it belonged to; a delta says which version it was computed against
(``base``). The receiver keeps, per bucket, the version its destination holds for it, and applies a
delta only when ``base`` equals it (:class:`~weightbridge.transport.errors.DeltaBaseMismatch`
otherwise: nothing of that bucket is written). The state lives in the
:class:`~weightbridge.transport.executor.Executor`, which lives as long as one epoch's bridge group:
a new epoch (late joiner, restarted rank, recovery after any failure) starts with no state, so its
first push is full everywhere, and any failed run drops the state on both ends.

**Memory.** Sender: one copy of the bytes it sends per push (Σ ``nbytes`` of its buckets, in the
wire dtype), allocated at its first push, freed with the executor (``auto`` frees a bucket's copy
while that bucket is sent in full), and while encoding one bucket temporaries of up to about twice
its size. Receivers: no copy; temporaries proportional to the changed elements of one bucket.

**auto** picks per bucket from the measured change: a bucket whose last encoded size was above
:data:`AUTO_MAX_RATIO` of the full bucket is sent in full, without comparing, for the next 1, 2, 4 ...
:data:`AUTO_MAX_BACKOFF` pushes, then measured again (one push re-copies the payload, the next compares).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import torch

from weightbridge.layout.box import box_shape
from weightbridge.plan.types import Bucket
from weightbridge.tensors import pack_items, read_elements, torch_dtype, unpack_items, write_elements
from weightbridge.transport import deltacode as dc

HEADER_BYTES = 64
FIRST_BYTES = 4096  # the first piece of every bucket's message: carries the header (the message length)
MAGIC = b"WBD1"
FULL, DELTA = 0, 1
AUTO_MAX_RATIO = 0.5
AUTO_MAX_BACKOFF = 16
_HEAD = struct.Struct("<4sBBBBqqqqqq4x")  # 60 bytes, then the CRC-32 of these 60
MODES = ("off", "auto", "on")


class Header(NamedTuple):
    kind: int  # FULL | DELTA
    pos: int  # deltacode.POS_* (0 for FULL)
    val: int  # deltacode.VAL_*
    low: int  # Elias-Fano low bits
    version: int  # the version this bucket carries
    base: int  # DELTA: the version it was computed against; FULL: -1
    length: int  # header + body bytes (the checksum trailer follows)
    changed: int  # changed elements (DELTA)
    pos_bytes: int  # bytes of the position section (DELTA)
    escapes: int  # escaped values (DELTA with a difference code)

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        head = _HEAD.pack(MAGIC, *self)
        raw = head + struct.pack("<I", zlib.crc32(head))
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)


def read_header(buf: torch.Tensor, capacity: int, trailer: int) -> Header:
    """The header at the start of a received message; ``ValueError`` when it is not a valid one for a
    buffer of ``capacity`` bytes (CRC, magic, codes, length)."""
    raw = bytes(buf[:HEADER_BYTES].cpu().numpy())
    if struct.unpack("<I", raw[60:64])[0] != zlib.crc32(raw[:60]):
        raise ValueError("bucket header fails its CRC")
    magic, *fields = _HEAD.unpack(raw[:60])
    h = Header(*fields)
    if magic != MAGIC:
        raise ValueError(f"bucket header has magic {magic!r}, expected {MAGIC!r}")
    if h.kind not in (FULL, DELTA) or not HEADER_BYTES <= h.length <= capacity - trailer:
        raise ValueError(f"bucket header kind {h.kind}, length {h.length} for a buffer of {capacity} bytes")
    if h.kind == DELTA and not (0 <= h.pos_bytes <= h.length - HEADER_BYTES and h.changed >= 0 and h.escapes >= 0):
        raise ValueError("bucket header has inconsistent section sizes")
    return h


def message_cuts(length: int, capacity: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """How a message of ``length`` bytes (trailer included) in a buffer of ``capacity`` is cut into P2P
    chunks: first ``[0, min(capacity, FIRST_BYTES))`` (the receiver learns ``length`` from it), then
    ``chunk_bytes`` pieces up to ``length``. Both ends compute the same cuts."""
    first = min(capacity, FIRST_BYTES)
    cuts = [(0, first)]
    cuts += [(lo, min(lo + chunk_bytes, length)) for lo in range(first, length, chunk_bytes)]
    return cuts


# -- bucket geometry -------------------------------------------------------------------------
BLOCK_ELEMENTS = 1 << 20  # elements compared at once (a multiple of 8: blocks pack into whole bitmap bytes)


class Span(NamedTuple):
    byte_off: int  # within the payload
    elem_off: int  # within the bucket's elements
    itemsize: int
    numel: int


@dataclass(frozen=True)
class Geometry:
    """Where a bucket's items lie as elements: one span per item; and compare blocks of
    :data:`BLOCK_ELEMENTS` elements, each as its pieces of runs of one element size."""

    nbytes: int
    elements: int
    items: tuple[Span, ...]
    blocks: tuple[tuple[Span, ...], ...]


def geometry(bucket: Bucket) -> Geometry:
    items, runs = [], []
    b = e = 0
    for it in bucket.items:
        s = torch_dtype(it.dtype).itemsize
        n = it.nbytes // s
        items.append(Span(b, e, s, n))
        if runs and runs[-1].itemsize == s:
            runs[-1] = runs[-1]._replace(numel=runs[-1].numel + n)
        else:
            runs.append(Span(b, e, s, n))
        b += it.nbytes
        e += n
    blocks = []
    for g0 in range(0, e, BLOCK_ELEMENTS):
        g1 = min(g0 + BLOCK_ELEMENTS, e)
        pieces = []
        for r in runs:
            lo, hi = max(g0, r.elem_off), min(g1, r.elem_off + r.numel)
            if lo < hi:
                pieces.append(Span(r.byte_off + (lo - r.elem_off) * r.itemsize, lo, r.itemsize, hi - lo))
        blocks.append(tuple(pieces))
    return Geometry(b, e, tuple(items), tuple(blocks))


def _ints(data: torch.Tensor, span: Span) -> torch.Tensor:
    """The elements of ``span`` in ``data`` (uint8) as a 1-D integer tensor of their size (a view when
    aligned, else a copy)."""
    raw = data[span.byte_off : span.byte_off + span.numel * span.itemsize]
    if raw.storage_offset() % span.itemsize:
        raw = raw.clone()
    return raw.view(dc.int_view_dtype(span.itemsize))


def _split(index: torch.Tensor, pieces: tuple[Span, ...]) -> list[torch.Tensor]:
    """A block's sorted changed indices (block-relative) as piece-relative indices of each piece."""
    if len(pieces) == 1:
        return [index]
    out, o = [], 0
    bounds = torch.tensor([p.elem_off - pieces[0].elem_off for p in pieces[1:]], dtype=index.dtype,
                          device=index.device)
    cuts = [0, *torch.searchsorted(index, bounds).tolist(), index.numel()]
    for p, lo, hi in zip(pieces, cuts, cuts[1:]):
        out.append(index[lo:hi] - o)
        o += p.numel
    return out


# -- sender ----------------------------------------------------------------------------------
@dataclass
class SendState:
    """What a sender keeps for one bucket: the payload it last sent and its version (auto: back-off)."""

    cache: torch.Tensor | None = None
    version: int | None = None
    skip: int = 0  # auto: pushes left to send in full without comparing
    backoff: int = 0


class Encoded(NamedTuple):
    kind: int
    length: int  # header + body
    changed: int  # changed elements (-1 when not compared)
    elements: int


class _Piece(NamedTuple):
    """The changed elements of one piece of a block that a difference code cannot carry (|d| > 7): their
    new bytes (``(n, itemsize)`` uint8 rows) and which of them d8 cannot carry either (|d| > 127)."""

    rows: torch.Tensor
    d8: torch.Tensor


class _Block(NamedTuple):
    """What the compare pass keeps of one block: its count, d8 codes (with the D8 sentinel), the escapes
    of each piece, and either its packed bitmap (dense blocks) or its changed indices as int32 (up to a
    quarter of its elements changed): at most a byte per element of the block either way, plus a byte per
    changed element."""

    count: int
    codes: torch.Tensor | None
    escapes: list[_Piece]
    bits: torch.Tensor | None
    index: torch.Tensor | None  # block-relative


class _Scan(NamedTuple):
    blocks: list[_Block]
    k: int
    raw: int  # bytes of every changed element
    esc8: int  # bytes of the elements d8 cannot carry
    esc4: int  # ... d4 cannot carry


DENSE = 4  # a block with at least 1 in DENSE elements changed keeps its bitmap instead of its indices


def _scan(payload: torch.Tensor, cache: torch.Tensor, geo: Geometry) -> _Scan:
    """Compare ``payload`` with ``cache`` block by block, keeping what encoding needs (:class:`_Block`),
    and make the cache equal to the payload as it goes (the caller sends either a delta or the full
    bucket: both leave the receiver holding the payload). Temporaries: one block."""
    blocks = []
    k = raw = esc8 = esc4 = 0
    for pieces in geo.blocks:
        news = [_ints(payload, p) for p in pieces]
        olds = [_ints(cache, p) for p in pieces]
        masks = [a != b for a, b in zip(news, olds)]
        mask = torch.cat(masks) if len(masks) > 1 else masks[0]
        index = torch.nonzero(mask).view(-1)
        c = index.numel()
        if not c:
            blocks.append(_Block(0, None, [], None, None))
            continue
        block_codes, escapes = [], []
        for p, a, b, idx in zip(pieces, news, olds, _split(index, pieces)):
            if not idx.numel():
                escapes.append(_Piece(payload.new_empty(0, p.itemsize), payload.new_empty(0, dtype=torch.bool)))
                continue
            new = torch.index_select(a, 0, idx)
            code = dc.codes8(new, torch.index_select(b, 0, idx), p.itemsize)
            _scatter(cache, p, idx, new)
            block_codes.append(code)
            wide = torch.nonzero(dc.escaped4(code)).view(-1)
            d8 = dc.escaped8(torch.index_select(code, 0, wide))
            escapes.append(_Piece(torch.index_select(new, 0, wide).view(torch.uint8).view(-1, p.itemsize), d8))
            n8 = int(torch.count_nonzero(d8))
            raw, esc8, esc4 = raw + idx.numel() * p.itemsize, esc8 + n8 * p.itemsize, esc4 + wide.numel() * p.itemsize
        codes = torch.cat(block_codes) if len(block_codes) > 1 else block_codes[0]
        dense = c * DENSE >= mask.numel()
        blocks.append(_Block(c, codes, escapes, dc.pack_bits(mask) if dense else None,
                             None if dense else index.to(torch.int32)))
        k += c
    return _Scan(blocks, k, raw, esc8, esc4)


def encode_bucket(buf: torch.Tensor, bucket: Bucket, geo: Geometry, source, state: SendState, *,
                  version: int, mode: str) -> Encoded:
    """Pack ``bucket`` from ``source`` into ``buf`` (its wire buffer) as a full bucket or a delta against
    ``state``, update ``state``, write the header. Returns what was encoded; the caller appends the
    checksum at ``length``."""
    n = geo.nbytes
    payload = buf[HEADER_BYTES : HEADER_BYTES + n]
    pack_items(bucket.items, source, buf, HEADER_BYTES)
    full = Encoded(FULL, HEADER_BYTES + n, -1, geo.elements)
    if mode == "auto" and state.skip > 0:
        state.skip -= 1
        state.cache, state.version = (payload.clone(), version) if state.skip == 0 else (None, None)
        return _write_full(buf, full, version)
    if state.cache is None:
        state.cache, state.version = payload.clone(), version
        return _write_full(buf, full, version)
    cache, base = state.cache, state.version
    scan = _scan(payload, cache, geo)
    full = full._replace(changed=scan.k)
    pos_code, low, pos_bytes = dc.position_sizes(scan.k, geo.elements)
    val_code, val_bytes = dc.value_sizes(scan.k, scan.raw, scan.esc8, scan.esc4)
    length = HEADER_BYTES + pos_bytes + val_bytes
    state.version = version  # the scan made the cache equal to the payload
    if length >= full.length:
        _auto(state, mode, 1.0)
        return _write_full(buf, full, version)
    sections, n_esc = _sections(payload, geo, scan, pos_code, low, val_code)
    if sum(x.numel() for x in sections) != length - HEADER_BYTES:
        raise AssertionError("delta sizes and sections disagree")
    _auto(state, mode, length / full.length)
    off = HEADER_BYTES
    for sec in sections:
        buf[off : off + sec.numel()].copy_(sec)
        off += sec.numel()
    head = Header(DELTA, pos_code, val_code, low, version, base, length, scan.k, pos_bytes, n_esc)
    buf[:HEADER_BYTES].copy_(head.to_tensor(buf.device))
    return Encoded(DELTA, length, scan.k, geo.elements)


def _sections(payload, geo: Geometry, scan: _Scan, pos_code: int, low: int, val_code: int):
    """``(sections, escapes)``: positions, then codes and escapes or raw values. Raw values are gathered
    from the still intact payload (which the caller then overwrites)."""
    dev = payload.device
    positions, bitmap, values, n_esc = [], [], [], 0
    for g, (pieces, blk) in enumerate(zip(geo.blocks, scan.blocks)):
        n = sum(p.numel for p in pieces)
        if not blk.count:
            if pos_code == dc.POS_BITMAP:
                bitmap.append(torch.zeros(-(-n // 8), dtype=torch.uint8, device=dev))
            continue
        index = None
        if blk.index is not None:
            index = blk.index.to(torch.int64)
        elif pos_code == dc.POS_EF or val_code == dc.VAL_RAW:
            index = torch.nonzero(dc.unpack_bits(blk.bits, n)).view(-1)
        if pos_code == dc.POS_EF:
            positions.append(index + g * BLOCK_ELEMENTS)
        else:
            bitmap.append(blk.bits if blk.bits is not None else dc.set_bits(index, n))
        if val_code == dc.VAL_RAW:
            for p, idx in zip(pieces, _split(index, pieces)):
                if idx.numel():
                    values.append(_ints(payload, p)[idx].view(torch.uint8))
        else:
            for esc in blk.escapes:
                rows = esc.rows if val_code == dc.VAL_D4 else esc.rows[esc.d8]
                n_esc += rows.shape[0]
                values.append(rows.reshape(-1))
    if pos_code == dc.POS_BITMAP:
        pos = torch.cat(bitmap) if len(bitmap) > 1 else bitmap[0]
    else:
        idx = torch.cat(positions) if positions else torch.empty(0, dtype=torch.int64, device=dev)
        pos = dc.encode_ef(idx, geo.elements, low)
    out = [pos]
    codes = [b.codes for b in scan.blocks if b.codes is not None]
    if val_code == dc.VAL_D8:  # one byte per code: the blocks' codes as they are, no concatenation
        out += [dc.encode_codes(c, val_code) for c in codes]
    elif val_code == dc.VAL_D4:  # nibble pairs may straddle blocks
        allc = torch.cat(codes) if len(codes) > 1 else codes[0] if codes else payload.new_empty(0, dtype=torch.int8)
        out.append(dc.encode_codes(allc, val_code))
    return out + values, n_esc


def _scatter(cache: torch.Tensor, span: Span, idx: torch.Tensor, values: torch.Tensor) -> None:
    raw = cache[span.byte_off : span.byte_off + span.numel * span.itemsize]
    if raw.storage_offset() % span.itemsize:
        raw.view(span.numel, span.itemsize)[idx] = values.view(torch.uint8).view(-1, span.itemsize)
    else:
        raw.view(dc.int_view_dtype(span.itemsize)).index_copy_(0, idx, values)


def _write_full(buf: torch.Tensor, enc: Encoded, version: int) -> Encoded:
    head = Header(FULL, 0, dc.VAL_RAW, 0, version, -1, enc.length, 0, 0, 0)
    buf[:HEADER_BYTES].copy_(head.to_tensor(buf.device))
    return enc


def _auto(state: SendState, mode: str, ratio: float) -> None:
    if mode != "auto":
        return
    if ratio > AUTO_MAX_RATIO:
        state.backoff = min(max(1, 2 * state.backoff), AUTO_MAX_BACKOFF)
        state.skip, state.cache, state.version = state.backoff, None, None
    else:
        state.backoff = 0


# -- receiver --------------------------------------------------------------------------------
def decode_bucket(buf: torch.Tensor, bucket: Bucket, geo: Geometry, target, h: Header) -> int:
    """Write a received message (header ``h``, checksum verified) into ``target``: the full payload, or
    the changed elements of a delta (old values read from ``target`` for difference codes). Returns the
    elements written. ``ValueError`` for a malformed delta (nothing of it written)."""
    if h.kind == FULL:
        if h.length != HEADER_BYTES + geo.nbytes:
            raise ValueError(f"full bucket of {h.length - HEADER_BYTES} bytes, the plan says {geo.nbytes}")
        unpack_items(bucket.items, buf, target, HEADER_BYTES)
        return geo.elements
    k, E = h.changed, geo.elements
    if k > E:
        raise ValueError(f"delta names {k} changed elements of {E}")
    body = buf[HEADER_BYTES : h.length]
    sec = body[: h.pos_bytes]
    if h.pos == dc.POS_BITMAP:
        positions = dc.decode_bitmap(sec, k, E)
    elif h.pos == dc.POS_EF:
        positions = dc.decode_ef(sec, k, E, h.low)
    else:
        raise ValueError(f"unknown position code {h.pos}")
    vals = body[h.pos_bytes :]
    starts = torch.tensor([s.elem_off for s in geo.items], dtype=torch.int64, device=positions.device)
    bounds = torch.searchsorted(positions, starts).tolist() + [k]
    codes = esc = None
    if h.val == dc.VAL_RAW:
        stream = vals
    elif h.val in (dc.VAL_D8, dc.VAL_D4):
        nbytes = k if h.val == dc.VAL_D8 else -(-k // 2)
        codes, esc = dc.decode_codes(vals[:nbytes], k, h.val)
        n_esc = int(torch.count_nonzero(esc))
        if n_esc != h.escapes:
            raise ValueError(f"delta has {n_esc} escapes, the header says {h.escapes}")
        stream = vals[nbytes:]
    else:
        raise ValueError(f"unknown value code {h.val}")
    esc_at = None if esc is None else torch.nonzero(esc).view(-1)  # escaped elements, in order
    if esc_at is not None:  # escapes before each item's first changed element
        esc_bounds = torch.searchsorted(esc_at, torch.tensor(bounds, dtype=torch.int64, device=esc_at.device)).tolist()
    need = 0  # the stream bytes the items consume: checked before any write
    plan = []
    for i, span in enumerate(geo.items):
        c0, c1 = bounds[i], bounds[i + 1]
        if c1 == c0:
            continue
        n_raw = (c1 - c0) if esc_at is None else esc_bounds[i + 1] - esc_bounds[i]
        plan.append((i, span, c0, c1, need, n_raw))
        need += n_raw * span.itemsize
    if need != stream.numel():
        raise ValueError(f"delta value stream of {stream.numel()} bytes, its elements need {need}")
    for i, span, c0, c1, off, n_raw in plan:
        it, s = bucket.items[i], span.itemsize
        idx = positions[c0:c1] - span.elem_off
        shape, dst, wire = box_shape(it.canonical_box), target[it.dst_tensor], torch_dtype(it.dtype)
        raw = stream[off : off + n_raw * s]
        raw = (raw.clone() if raw.storage_offset() % s else raw).view(dc.int_view_dtype(s))
        if esc_at is None:
            values = raw
        elif n_raw == c1 - c0:  # every element escaped
            values = raw
        else:
            if s not in (2, 4):
                raise ValueError(f"difference code for {s}-byte elements")
            # In the wire dtype: a destination wider than its wire (a checkpoint cast) holds values
            # that came through that dtype, so the cast down is exact.
            old = read_elements(dst, it.dst_box, it.dst_transpose, shape, idx).to(wire).view(dc.int_view_dtype(s))
            values = dc.apply_codes(old, codes[c0:c1], s)  # escaped ones are overwritten next
            if n_raw:
                e0 = esc_bounds[i]
                values.index_copy_(0, esc_at[e0 : e0 + n_raw] - c0, raw)
        write_elements(dst, it.dst_box, it.dst_transpose, shape, idx, values.view(wire))
    return k
