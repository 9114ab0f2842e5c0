"""The wire of one rank's round: transfers (a bucket to send or receive), chunk cuts, checksums.

Pure torch (no torch.distributed): :func:`chunk_bounds` cuts a wire buffer into P2P chunks
identically on both ends; :func:`checksum` is the 8-byte trailer a bucket carries with
``checksums=True`` (the default, ``sync.checksums``): XXH3-64 (63 bits kept) on CPU wire buffers
(Gloo), and :func:`poly_hash` on other devices (NCCL: computed where the bytes are, no copy to the
host). XXH3 replaced CRC-32 on CPU: it runs at ~14 GiB/s on one core here against CRC-32's ~3.5,
which made checksums cost more than the transfer itself (bench/transfer_gloo.py: checksums on / off
2.3x with CRC-32); any corruption escapes it with probability about 2^-63.
Both ends of a bucket hold their wire buffers on the same kind of device (Gloo: CPU on both,
NCCL: CUDA on both), so they compute the same function.

``poly_hash`` is two polynomial hashes modulo the prime p = 2^31 - 1 over the buffer's 16-bit words,
word i weighted by g^i (g = 16807 and 48271, primitive roots mod p), packed into 62 bits. Word
weights are distinct and never a negated pair within a bucket (g^k = -1 needs k = 2^30 - 1 words,
2 GiB), so every change of one word, every swap of two different words or bytes and every +d/-d
compensating pair is detected for certain; any other corruption escapes with probability about
2^-62 (n/p per hash for a change of two words with arbitrary amounts). The old position-weighted byte sum
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


def poly_hash(data: torch.Tensor) -> int:
    """The device-side checksum of a 1-D uint8 tensor (module docstring), computed on its device.

    Deterministic and device-independent (the same value on CPU and CUDA for the same bytes);
    called on the sender after packing and on the receiver before unpacking each bucket.
    """
    n = data.numel()
    if n == 0:
        return 0
    dev = data.device
    if n % 2:
        data = torch.cat([data, torch.zeros(1, dtype=torch.uint8, device=dev)])
    words_all = data.view(torch.int16)
    m = words_all.numel()
    weights = [_block_weights(dev, g) for g in _GENERATORS]
    totals = [torch.zeros((), dtype=torch.int64, device=dev) for _ in _GENERATORS]
    rows_total = -(-m // _BLOCK)
    for r0 in range(0, rows_total, _ROWS):
        r1 = min(r0 + _ROWS, rows_total)
        x = words_all[r0 * _BLOCK : min(r1 * _BLOCK, m)].to(torch.int64) & 0xFFFF
        if x.numel() < (r1 - r0) * _BLOCK:
            x = torch.nn.functional.pad(x, (0, (r1 - r0) * _BLOCK - x.numel()))
        x = x.view(r1 - r0, _BLOCK)
        for k, g in enumerate(_GENERATORS):
            inner = (x * weights[k]).sum(dim=1) % _P
            rp = torch.tensor(_rows_powers(g, r0, r1), dtype=torch.int64, device=dev)
            totals[k] += (inner * rp % _P).sum()
    h = [int(t.item()) % _P for t in totals]
    return h[0] | (h[1] << 32)


def write_trailer(buf: torch.Tensor, n: int, value: int) -> None:
    buf[n : n + CHECKSUM_BYTES].copy_(torch.tensor([value], dtype=torch.int64).view(torch.uint8).to(buf.device))


def read_trailer(buf: torch.Tensor, n: int) -> int:
    return int(buf[n : n + CHECKSUM_BYTES].cpu().clone().view(torch.int64)[0])
