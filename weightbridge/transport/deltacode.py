"""Delta coding primitives (pure torch, any device): where elements changed, and their new values.

A delta of one bucket is a sorted set ``P`` of changed element indices in ``[0, E)`` (the bucket's
elements in wire order, items back to back) and the new bits of each changed element.

**Positions**, whichever is smaller for the bucket (:func:`position_sizes`):

* *bitmap*: one bit per element, little-endian within a byte (``ceil(E / 8)`` bytes);
* *Elias-Fano* (sorted index runs as low bits + unary high bits): with ``L`` low bits per index,
  the low parts ``P_j mod 2^L`` packed ``L`` bits each, then a bit array with bit
  ``(P_j >> L) + j`` set for every ``j`` (``((E - 1) >> L) + k`` bits). About ``2 + log2(E / k)``
  bits per changed element; decoded without a sequential scan (``nonzero`` of the bit array).

**Values** (:func:`value_sizes`), whichever is smaller: *raw* (the new element bytes), or the
difference ``new - old`` of the elements' bit patterns read as unsigned integers, one signed byte
(*d8*, -127..127) or one signed nibble (*d4*, -7..7, two per byte, low nibble first) per changed
element, the sentinel (-128 / -8) marking an *escape* whose raw new bytes follow in an escape
stream. With bf16 weights and small learning rates most changes are one or two units in the last
place, so a changed element costs about 1.5 to 2.5 bytes with its position instead of 2 raw bytes
plus an index. Differences are used for 2- and 4-byte elements only; 1- and 8-byte elements are
always escapes in the difference codes.

Everything is vectorized (no Python loop over elements); temporaries are bounded by blocks of
:data:`BLOCK` indices. Decoders validate what they read (counts, bounds, strict order) and raise
``ValueError`` on malformed input, so hostile bytes never index out of range.
"""

from __future__ import annotations

import torch

BLOCK = 1 << 16  # indices per step of the low-bit packers (temporaries: BLOCK x L int32)
POS_BITMAP, POS_EF = 1, 2
VAL_RAW, VAL_D8, VAL_D4 = 0, 1, 2
D8_ESC, D4_ESC = -128, -8
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view_dtype(itemsize: int) -> torch.dtype:
    """The integer dtype a wire element of ``itemsize`` bytes is compared as."""
    return _INT[itemsize]


# -- bits <-> bytes ----------------------------------------------------------------------------
def _as_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``b`` (length a multiple of 8) as int64 words, copying only when misaligned."""
    if b.storage_offset() % 8 or not b.is_contiguous():
        b = b.clone()
    return b.view(torch.int64)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor of 0/1 (bool or uint8) as bytes, bit ``i`` at byte ``i // 8``, bit ``i % 8``.

    Eight 0/1 bytes read as one little-endian int64 are gathered into its low byte by three
    shift-or steps (no multiply, no per-bit pass)."""
    n = bits.numel()
    b = bits.view(torch.uint8) if bits.dtype == torch.bool else bits.to(torch.uint8)
    pad = -n % 8
    if pad:
        b = torch.cat([b, torch.zeros(pad, dtype=torch.uint8, device=b.device)])
    x = _as_words(b)
    x = x | (x >> 7)
    x = x | (x >> 14)
    x = x | (x >> 28)
    return (x & 0xFF).to(torch.uint8)


def unpack_bits(data: torch.Tensor, nbits: int) -> torch.Tensor:
    """The first ``nbits`` bits of ``data`` (uint8) as a uint8 0/1 tensor (inverse of :func:`pack_bits`)."""
    if data.numel() * 8 < nbits:
        raise ValueError(f"{data.numel()} bytes hold fewer than {nbits} bits")
    x = data[: -(-nbits // 8)].to(torch.int64)
    x = (x | (x << 28)) & 0x0000000F0000000F
    x = (x | (x << 14)) & 0x0003000300030003
    x = (x | (x << 7)) & 0x0101010101010101
    return x.view(torch.uint8)[:nbits]


def set_bits(positions: torch.Tensor, nbits: int) -> torch.Tensor:
    """Bytes of an ``nbits`` bit array with exactly the ``positions`` set."""
    bits = torch.zeros(nbits, dtype=torch.uint8, device=positions.device)
    bits[positions] = 1
    return pack_bits(bits)


# -- positions ---------------------------------------------------------------------------------
def ef_low_bits(k: int, elements: int) -> int:
    """The low-bit width that minimises the Elias-Fano size of ``k`` indices below ``elements``."""
    if k <= 0 or elements <= 1:
        return 0
    guess = max(0, (elements // k).bit_length() - 1)
    return min((max(0, guess + d) for d in (-1, 0, 1)), key=lambda low: ef_bytes(k, elements, low))


def ef_bytes(k: int, elements: int, low: int) -> int:
    """Bytes of the Elias-Fano code of ``k`` indices below ``elements`` with ``low`` low bits."""
    if k <= 0:
        return 0
    return -(-k * low // 8) + -(-(((elements - 1) >> low) + k) // 8)


def position_sizes(k: int, elements: int) -> tuple[int, int, int]:
    """``(code, low bits, bytes)`` of the smaller position code for ``k`` of ``elements`` changed."""
    if k == 0:
        return POS_EF, 0, 0
    low = ef_low_bits(k, elements)
    ef = ef_bytes(k, elements, low)
    bitmap = -(-elements // 8)
    return (POS_BITMAP, 0, bitmap) if bitmap <= ef else (POS_EF, low, ef)


def encode_ef(positions: torch.Tensor, elements: int, low: int) -> torch.Tensor:
    """Elias-Fano bytes of sorted int64 ``positions`` below ``elements`` (low parts first)."""
    k = positions.numel()
    if k == 0:
        return torch.empty(0, dtype=torch.uint8, device=positions.device)
    parts = []
    if low:
        shifts = torch.arange(low, dtype=torch.int32, device=positions.device)
        for lo in range(0, k, BLOCK):  # BLOCK is a multiple of 8: every block packs into whole bytes
            vals = (positions[lo : lo + BLOCK] & ((1 << low) - 1)).to(torch.int32)
            parts.append(pack_bits(((vals.unsqueeze(1) >> shifts) & 1).view(-1)))
    high = (positions >> low) + torch.arange(k, dtype=torch.int64, device=positions.device)
    parts.append(set_bits(high, ((elements - 1) >> low) + k))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    if out.numel() != ef_bytes(k, elements, low):
        raise AssertionError("Elias-Fano size formula and encoder disagree")
    return out


def decode_ef(data: torch.Tensor, k: int, elements: int, low: int) -> torch.Tensor:
    """Inverse of :func:`encode_ef`: ``k`` strictly increasing int64 indices below ``elements``."""
    if not 0 <= low <= 40:
        raise ValueError(f"Elias-Fano low bits {low} out of range")
    if data.numel() != ef_bytes(k, elements, low):
        raise ValueError(f"Elias-Fano section of {data.numel()} bytes, expected {ef_bytes(k, elements, low)}")
    if k == 0:
        return torch.empty(0, dtype=torch.int64, device=data.device)
    nlow = -(-k * low // 8)
    dev = data.device
    lows = torch.zeros(k, dtype=torch.int64, device=dev)
    if low:
        shifts = torch.arange(low, dtype=torch.int64, device=dev)
        for lo in range(0, k, BLOCK):
            n = min(BLOCK, k - lo)
            bits = unpack_bits(data[lo * low // 8 : nlow], n * low).view(n, low).to(torch.int64)
            lows[lo : lo + n] = (bits << shifts).sum(dim=1)
    upper = unpack_bits(data[nlow:], ((elements - 1) >> low) + k)
    ones = torch.nonzero(upper).view(-1)
    if ones.numel() != k:
        raise ValueError(f"Elias-Fano high bits name {ones.numel()} indices, the header says {k}")
    positions = ((ones - torch.arange(k, dtype=torch.int64, device=dev)) << low) | lows
    return check_positions(positions, elements)


def encode_bitmap(mask: torch.Tensor) -> torch.Tensor:
    return pack_bits(mask)


def decode_bitmap(data: torch.Tensor, k: int, elements: int) -> torch.Tensor:
    if data.numel() != -(-elements // 8):
        raise ValueError(f"bitmap of {data.numel()} bytes for {elements} elements")
    parts, step = [], BLOCK * 16  # bits per step (a multiple of 8)
    for lo in range(0, elements, step):
        n = min(step, elements - lo)
        parts.append(torch.nonzero(unpack_bits(data[lo // 8 :], n)).view(-1) + lo)
    positions = torch.cat(parts) if len(parts) > 1 else parts[0]
    if positions.numel() != k:
        raise ValueError(f"bitmap names {positions.numel()} changed elements, the header says {k}")
    return positions


def check_positions(positions: torch.Tensor, elements: int) -> torch.Tensor:
    """``positions`` if strictly increasing within ``[0, elements)``, else ``ValueError``."""
    if positions.numel():
        if int(positions[0]) < 0 or int(positions[-1]) >= elements:
            raise ValueError(f"changed element index outside [0, {elements})")
        if positions.numel() > 1 and not bool((positions[1:] > positions[:-1]).all()):
            raise ValueError("changed element indices are not strictly increasing")
    return positions


# -- values ------------------------------------------------------------------------------------
def _unsigned(values: torch.Tensor, s: int) -> torch.Tensor:
    # 2-byte elements fit int32 (half the memory traffic of int64); 4-byte ones need int64
    wide = torch.int32 if s == 2 else torch.int64
    return values.to(wide) & ((1 << (8 * s)) - 1)


def differences(new: torch.Tensor, old: torch.Tensor, s: int) -> torch.Tensor | None:
    """``new - old`` of ``s``-byte elements (1-D integer tensors of that size) as unsigned bit patterns
    (int32 for 2-byte elements, int64 for 4-byte ones); None where differences are not used (s not 2 or 4)."""
    if s not in (2, 4):
        return None
    return _unsigned(new, s) - _unsigned(old, s)


def apply_differences(old: torch.Tensor, diffs: torch.Tensor, s: int) -> torch.Tensor:
    """``old + diffs`` modulo ``2^(8 s)`` (the inverse of :func:`differences`), in ``old``'s integer dtype."""
    bits = 8 * s
    new = (_unsigned(old, s) + diffs) & ((1 << bits) - 1)
    new -= (new >> (bits - 1)) << bits  # to two's complement, exactly
    return new.to(old.dtype)


def value_sizes(k: int, raw_bytes: int, esc8_bytes: int, esc4_bytes: int) -> tuple[int, int]:
    """``(code, bytes)`` of the smallest value code: raw, d8 (k + escapes) or d4 (k / 2 + escapes)."""
    options = [(raw_bytes, VAL_RAW), (k + esc8_bytes, VAL_D8), (-(-k // 2) + esc4_bytes, VAL_D4)]
    size, code = min(options)
    return code, size


def encode_codes(diffs: torch.Tensor, esc: torch.Tensor, code: int) -> torch.Tensor:
    """The difference codes (int64 ``diffs``, bool ``esc``) as bytes: one per element (d8) or nibbles (d4)."""
    if code == VAL_D8:
        return torch.where(esc, torch.full_like(diffs, D8_ESC), diffs).to(torch.int8).view(torch.uint8)
    nib = torch.where(esc, torch.full_like(diffs, D4_ESC), diffs) & 0xF
    if nib.numel() % 2:
        nib = torch.cat([nib, torch.zeros(1, dtype=nib.dtype, device=nib.device)])
    pairs = nib.view(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)


def decode_codes(data: torch.Tensor, k: int, code: int) -> torch.Tensor:
    """Inverse of :func:`encode_codes`: int64 codes, the sentinel included."""
    if code == VAL_D8:
        if data.numel() != k:
            raise ValueError(f"d8 section of {data.numel()} bytes for {k} values")
        return data.view(torch.int8).to(torch.int64)
    if data.numel() != -(-k // 2):
        raise ValueError(f"d4 section of {data.numel()} bytes for {k} values")
    b = data.to(torch.int64)
    nib = torch.stack([b & 0xF, b >> 4], dim=1).view(-1)[:k]
    return torch.where(nib >= 8, nib - 16, nib)
