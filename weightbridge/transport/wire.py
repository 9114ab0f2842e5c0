"""The wire of one rank's round: transfers (a bucket to send or receive), chunk cuts, checksums.

Pure torch (no torch.distributed): :func:`chunk_bounds` cuts a wire buffer into P2P chunks
identically on both ends; :func:`bucket_sum` is the 8-byte trailer a bucket carries with
``checksums=True`` (the default, ``sync.checksums``): on Gloo XXH3-64 (63 bits kept) of the CPU wire
buffers, on NCCL :func:`poly_sums` computed where the bytes are (the device), never copied to the
host. XXH3 replaced CRC-32 on CPU: it runs at ~14 GiB/s on one core here against CRC-32's ~3.5,
which made checksums cost more than the transfer itself (bench/transfer_gloo.py: checksums on / off
2.3x with CRC-32); any corruption escapes it with probability about 2^-63.
Both ends of a bucket use the same backend (the handshake compares them), so they compute the
same function.

**Host synchronisations (NCCL).** A sender computes and writes its trailers on the device without
one (the hash tables are cached on the device; only Python integers cross from the host, as kernel
arguments). A receiver reads every bucket's trailer and computes its sum on the device, and
:func:`resolve` fetches all of a round's values at once: one synchronisation per round (it was an
``.item()`` per 8 MiB, two pageable host-to-device copies per 8 MiB, and one read per trailer).

``poly_hash`` is two polynomial hashes modulo the prime p = 2^31 - 1 over the buffer's 16-bit words,
word i weighted by g^i (g = 16807 and 48271, primitive roots mod p), packed into 62 bits. Word
weights are distinct and never a negated pair within a bucket (g^k = -1 needs k = 2^30 - 1 words,
2 GiB), so every change of one word, every swap of two different words or bytes and every +d/-d
compensating pair is detected for certain; any other corruption escapes with probability about
2^-62 (n/p per hash for a change of two words with arbitrary amounts). Words are little-endian byte
pairs from the buffer's first byte, whatever its storage offset (a slab region after an odd-sized
int8/fp8/bool item starts at an odd one, where an ``int16`` view raises); an odd last byte is a
word of its own. A bucket sent as several messages sums their concatenation, each padded to an even
length (the words of message k weighted on from where message k - 1 ended). The old position-weighted byte sum
(weights ``i % 1000003 + 1``, no modulus) missed swaps 1000003 bytes apart and compensating changes
such as +2 at byte 1 and -1 at byte 3 (tests/transport/test_checksums.py).
"""

from __future__ import annotations

from typing import Any

import torch
import xxhash

from weightbridge.errors import ProtocolError
from weightbridge.plan.types import Bucket

CHECKSUM_BYTES = 8
_MASK63 = (1 << 63) - 1  # the trailer is an int64


class Transfer:
    """One bucket of one round seen from this rank: a wire buffer to send or to receive.

    ``buf`` is the bucket's region of the round's slab (its capacity: every byte the bucket may
    need). The buffers that cross the wire (see :func:`split_items`): ``direct``, one per direct
    item, each either a view of the tensor itself (zero-copy) or a region of ``buf``; and
    ``packed_msg``, the packed items and the checksum trailer (a prefix of ``buf``; ``None`` when
    empty). A round sends every direct message of its transfers before any packed one
    (:class:`~weightbridge.transport.comm.RoundComm`), so a sender can put the large items on the
    wire before it has packed the small ones. ``unpack`` lists what ``post`` still copies out of
    ``buf``: ``(items, offset)`` runs.
    """

    __slots__ = ("bucket", "peer", "send", "buf", "nbytes", "length", "header", "direct", "packed_msg", "unpack",
                 "packed")

    def __init__(self, bucket: Bucket, peer: int, send: bool, nbytes: int) -> None:
        self.bucket = bucket
        self.peer = peer
        self.send = send
        self.nbytes = nbytes  # the wire buffer's size (with sync.delta: header + bucket + trailer, the most sent)
        self.length = nbytes  # bytes of the message (sync.delta: known at pack time / from the header)
        self.header: Any = None  # sync.delta, receiving: the message's header, read after the first chunk
        self.buf: torch.Tensor | None = None
        self.direct: list[torch.Tensor] = []
        self.packed_msg: torch.Tensor | None = None
        self.unpack: list[tuple[tuple, int]] = []
        self.packed = 0  # bytes of the packed items (the checksum trailer follows them in buf)


# An item of at least this many bytes moves as a message of its own, straight from the sender's
# tensor into the receiver's when its box is contiguous there at the wire dtype (no pack, no unpack
# copy). Smaller items are packed: one message per bucket keeps small tensors from costing a
# message each. A constant, so that every rank cuts a bucket into the same messages.
DIRECT_BYTES = 1 << 20


def split_items(items: tuple, direct_bytes: int) -> tuple[tuple, tuple]:
    """A bucket's items as ``(packed, direct)``, each in item order: the items that go into the
    packed message (smaller than ``direct_bytes``) and those that move as messages of their own.

    Wire order of a bucket: the packed message (the packed items back to back, then the checksum
    trailer), then the direct items, one message each. A pure function of the plan: both ends cut alike.
    """
    direct = tuple(it for it in items if it.nbytes >= direct_bytes)
    if not direct:
        return items, ()
    return tuple(it for it in items if it.nbytes < direct_bytes), direct


def bucket_sum(messages: list[torch.Tensor], on_device: bool) -> int | torch.Tensor:
    """The trailer value of a bucket sent as ``messages`` (1-D uint8, in wire order). ``on_device`` False
    (Gloo, CPU buffers): an int, XXH3 (:func:`combine_checksums` of several). True (NCCL): the poly hash
    of their concatenation (module docstring) as a 0-d int64 tensor on their device, computed without a
    host synchronisation (:func:`write_trailer` writes it, :func:`resolve` reads it)."""
    if not on_device:
        return combine_checksums([checksum(m) for m in messages])
    acc: list[torch.Tensor] | None = None
    words = 0
    for m in messages:
        sums = poly_sums(m)
        if words:  # shift this message's word weights past the words before it
            sums = [h * pow(g, words, _P) % _P for h, g in zip(sums, _GENERATORS)]
        acc = sums if acc is None else [(a + h) % _P for a, h in zip(acc, sums)]
        words += (m.numel() + 1) // 2
    if acc is None:
        return 0
    return acc[0] | (acc[1] << 32)


def resolve(values: list[int | torch.Tensor]) -> list[int]:
    """``values`` as ints; device tensors among them fetched in one host synchronisation (one per round)."""
    dev = [v for v in values if isinstance(v, torch.Tensor)]
    if not dev:
        return [int(v) for v in values]  # type: ignore[arg-type]
    fetched = iter(torch.stack([v.reshape(()) for v in dev]).tolist())
    return [next(fetched) if isinstance(v, torch.Tensor) else int(v) for v in values]


def combine_checksums(values: list[int]) -> int:
    """One trailer for a bucket sent as several messages: the XXH3 checksum of their checksums (8 bytes
    each, little-endian, in wire order). A bucket sent as one message keeps that message's checksum."""
    if len(values) == 1:
        return values[0]
    return xxhash.xxh3_64_intdigest(b"".join(v.to_bytes(8, "little") for v in values)) & _MASK63


def wire_buffer(tr: Transfer, group: Any, round_index: int) -> torch.Tensor:
    """The wire buffer of a packed transfer (:class:`ProtocolError` if it was released already)."""
    if tr.buf is None:
        raise ProtocolError(group.describe_rank(group.rank), f"round {round_index}: a transfer has no wire buffer")
    return tr.buf


def chunk_bounds(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """How a wire buffer of ``nbytes`` is cut into P2P chunks (identical on both ends)."""
    if nbytes <= 0:
        return []
    return [(lo, min(lo + chunk_bytes, nbytes)) for lo in range(0, nbytes, chunk_bytes)]


def checksum(data: torch.Tensor) -> int:
    """Checksum of a 1-D uint8 tensor: XXH3-64 (63 bits) on CPU; :func:`poly_hash` (on the device) elsewhere."""
    if data.device.type == "cpu":
        return xxhash.xxh3_64_intdigest(data.numpy()) & _MASK63 if data.numel() else 0
    return poly_hash(data)


_P = (1 << 31) - 1  # the Mersenne prime of both hashes
_GENERATORS = (16807, 48271)  # primitive roots mod _P (the MINSTD multipliers)
_BLOCK = 1 << 16  # words per row: a row's sum of word (< 2^16) x weight (< 2^31) stays below 2^63
_ROWS = 64  # rows per step: 8 MiB of wire bytes at a time (bounded temporaries)
_weights: dict[tuple[str, int], torch.Tensor] = {}  # (device, g) -> g^k mod p, k < _BLOCK
_row_powers: dict[int, list[int]] = {}  # g -> [g^(j * _BLOCK) mod p for j = 0, 1, ...]


def _block_weights(device: torch.device, g: int) -> torch.Tensor:
    key = (str(device), g)
    w = _weights.get(key)
    if w is None:
        vals, x = [], 1
        for _ in range(_BLOCK):
            vals.append(x)
            x = x * g % _P
        w = _weights[key] = torch.tensor(vals, dtype=torch.int64, device=device)
    return w


def _rows_powers(g: int, lo: int, hi: int) -> list[int]:
    pw = _row_powers.setdefault(g, [1])
    step = pow(g, _BLOCK, _P)
    while len(pw) < hi:
        pw.append(pw[-1] * step % _P)
    return pw[lo:hi]


def _device_row_powers(device: torch.device, g: int, rows: int) -> torch.Tensor:
    """g^(j * _BLOCK) mod p for j < rows (at least), cached on ``device``: copied there only when it grows."""
    key = (str(device), g)
    have = _row_tensors.get(key)
    if have is None or have.numel() < rows:
        size = max(rows, 2 * (have.numel() if have is not None else 64))
        have = _row_tensors[key] = torch.tensor(_rows_powers(g, 0, size), dtype=torch.int64, device=device)
    return have


_row_tensors: dict[tuple[str, int], torch.Tensor] = {}


def _words(data: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Words ``lo`` to ``hi`` (exclusive) of ``data`` as int64 in [0, 2^16): little-endian byte pairs, an odd
    last byte alone. Any storage offset: where an ``int16`` view would raise (odd), pairs are read as bytes."""
    seg = data[2 * lo : min(2 * hi, data.numel())]
    even = seg.numel() - seg.numel() % 2
    if not even:
        w = torch.empty(0, dtype=torch.int64, device=data.device)
    elif seg.storage_offset() % 2 == 0:
        w = seg[:even].view(torch.int16).to(torch.int64) & 0xFFFF
    else:
        pairs = seg[:even].view(-1, 2).to(torch.int64)
        w = pairs[:, 0] | (pairs[:, 1] << 8)
    if seg.numel() % 2:
        w = torch.cat([w, seg[-1:].to(torch.int64)])
    return w


def poly_sums(data: torch.Tensor) -> list[torch.Tensor]:
    """The two hashes of a 1-D uint8 tensor (module docstring) as 0-d int64 tensors on its device, each
    in [0, p): no host synchronisation."""
    dev = data.device
    totals = [torch.zeros((), dtype=torch.int64, device=dev) for _ in _GENERATORS]
    m = (data.numel() + 1) // 2
    if m == 0:
        return totals
    rows_total = -(-m // _BLOCK)
    weights = [_block_weights(dev, g) for g in _GENERATORS]
    row_powers = [_device_row_powers(dev, g, rows_total) for g in _GENERATORS]
    for r0 in range(0, rows_total, _ROWS):
        r1 = min(r0 + _ROWS, rows_total)
        x = _words(data, r0 * _BLOCK, min(r1 * _BLOCK, m))
        if x.numel() < (r1 - r0) * _BLOCK:
            x = torch.nn.functional.pad(x, (0, (r1 - r0) * _BLOCK - x.numel()))
        x = x.view(r1 - r0, _BLOCK)
        for k in range(len(_GENERATORS)):
            inner = (x * weights[k]).sum(dim=1) % _P
            totals[k] += (inner * row_powers[k][r0:r1] % _P).sum()
    return [t % _P for t in totals]


def poly_hash(data: torch.Tensor) -> int:
    """The device-side checksum of a 1-D uint8 tensor (module docstring), computed on its device; one
    host synchronisation (the NCCL path uses :func:`poly_sums` and :func:`resolve` instead).

    Deterministic and device-independent (the same value on CPU and CUDA for the same bytes, at any
    storage offset).
    """
    h0, h1 = torch.stack(poly_sums(data)).tolist()
    return h0 | (h1 << 32)


def write_trailer(buf: torch.Tensor, n: int, value: int | torch.Tensor) -> None:
    """Write ``value`` (an int, or a 0-d int64 tensor on ``buf``'s device: no host round trip) at ``buf[n:n+8]``."""
    if isinstance(value, torch.Tensor):
        raw = value.reshape(1).to(torch.int64).view(torch.uint8)
    else:
        raw = torch.tensor([value], dtype=torch.int64).view(torch.uint8).to(buf.device)
    buf[n : n + CHECKSUM_BYTES].copy_(raw)


def read_trailer(buf: torch.Tensor, n: int) -> int | torch.Tensor:
    """The trailer at ``buf[n:n+8]``: an int from a CPU buffer, else a 0-d int64 tensor on its device (read
    with the round's other values by :func:`resolve`). Any offset (copied to an aligned temporary)."""
    raw = buf[n : n + CHECKSUM_BYTES]
    if raw.device.type == "cpu":
        return int(raw.clone().view(torch.int64)[0])
    return torch.empty(CHECKSUM_BYTES, dtype=torch.uint8, device=raw.device).copy_(raw).view(torch.int64)[0]
