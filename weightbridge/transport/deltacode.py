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
difference ``new - old`` of the elements' bit patterns modulo ``2^bits``, one signed byte (*d8*,
-127..126; -128 and 127 mark an escape) or one signed nibble (*d4*, -7..7; -8 marks an escape; two
per byte, low nibble first) per changed element, the raw new bytes of every escape following in an
escape stream. With bf16 weights and small learning rates most changes are one or two units in the last
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


def pack_fields(values: torch.Tensor, width: int) -> torch.Tensor:
    """Non-negative int64 ``values`` below ``2^width`` as a little-endian bit stream of ``width`` bits each
    (``ceil(n width / 8)`` bytes). Up to 8 bits: eight values at a time make one int64 word whose first
    ``width`` bytes are exactly their ``8 width`` bits; wider fields go bit by bit (few of them: wide
    fields mean few changed elements)."""
    n, dev = values.numel(), values.device
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=dev)
    if width <= 8:
        pad = -n % 8
        v = torch.cat([values, values.new_zeros(pad)]) if pad else values
        shifts = torch.arange(0, 8 * width, width, dtype=torch.int64, device=dev)
        words = (v.view(-1, 8) << shifts).sum(dim=1)
        out = words.view(torch.uint8).view(-1, 8)[:, :width].reshape(-1)
        return out[: -(-n * width // 8)]
    parts, shifts = [], torch.arange(width, dtype=torch.int64, device=dev)
    for lo in range(0, n, BLOCK):  # BLOCK is a multiple of 8: every block packs into whole bytes
        parts.append(pack_bits(((values[lo : lo + BLOCK].unsqueeze(1) >> shifts) & 1).view(-1)))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def unpack_fields(data: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_fields`: ``n`` int64 values."""
    dev = data.device
    if width <= 8:
        groups = -(-n // 8)
        raw = data[: groups * width]
        if raw.numel() < groups * width:
            raw = torch.cat([raw, raw.new_zeros(groups * width - raw.numel())])
        words = torch.zeros(groups, 8, dtype=torch.uint8, device=dev)
        words[:, :width] = raw.view(groups, width)
        shifts = torch.arange(0, 8 * width, width, dtype=torch.int64, device=dev)
        vals = (words.view(torch.int64) >> shifts) & ((1 << width) - 1)
        return vals.view(-1)[:n]
    out = torch.empty(n, dtype=torch.int64, device=dev)
    shifts = torch.arange(width, dtype=torch.int64, device=dev)
    for lo in range(0, n, BLOCK):
        m = min(BLOCK, n - lo)
        bits = unpack_bits(data[lo * width // 8 :], m * width).view(m, width).to(torch.int64)
        out[lo : lo + m] = (bits << shifts).sum(dim=1)
    return out


def encode_ef(positions: torch.Tensor, elements: int, low: int) -> torch.Tensor:
    """Elias-Fano bytes of sorted int64 ``positions`` below ``elements`` (low parts first)."""
    k = positions.numel()
    if k == 0:
        return torch.empty(0, dtype=torch.uint8, device=positions.device)
    parts = [pack_fields(positions & ((1 << low) - 1), low)] if low else []
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
    upper = unpack_bits(data[nlow:], ((elements - 1) >> low) + k)
    ones = torch.nonzero(upper).view(-1)
    if ones.numel() != k:
        raise ValueError(f"Elias-Fano high bits name {ones.numel()} indices, the header says {k}")
    positions = (ones - torch.arange(k, dtype=torch.int64, device=dev)) << low
    if low:
        positions |= unpack_fields(data[:nlow], k, low)
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
def codes8(new: torch.Tensor, old: torch.Tensor, s: int) -> torch.Tensor:
    """int8 difference codes of changed ``s``-byte elements (1-D integer tensors of that size): ``new - old``
    modulo ``2^(8 s)`` (read as a signed number) saturated to ``[-128, 127]``; a saturated code (-128 or
    127) is an escape. 2-byte elements subtract in int16 (modular: the result is exact bits whatever the
    true difference); 1- and 8-byte elements are always escapes."""
    if s == 2:
        d = new - old
    elif s == 4:
        d = new.to(torch.int64) - old.to(torch.int64)
        d = ((d + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    else:
        return torch.full((new.numel(),), D8_ESC, dtype=torch.int8, device=new.device)
    return d.clamp_(-128, 127).to(torch.int8)


def escaped8(codes: torch.Tensor) -> torch.Tensor:
    """The d8 escapes among int8 codes (saturated: -128 or 127)."""
    return (codes == D8_ESC) | (codes == 127)


def escaped4(codes: torch.Tensor) -> torch.Tensor:
    """The codes d4 cannot carry: outside ``[-7, 7]`` (int8 ``c + 7`` read unsigned is above 14)."""
    return (codes + 7).view(torch.uint8) > 14


def apply_codes(old: torch.Tensor, codes: torch.Tensor, s: int) -> torch.Tensor:
    """``old + codes`` modulo ``2^(8 s)`` in ``old``'s integer dtype (the inverse of :func:`codes8` for the
    codes that are not escapes)."""
    if s == 2:
        return old + codes.to(torch.int16)
    new = old.to(torch.int64) + codes
    return (((new + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).to(old.dtype)


def value_sizes(k: int, raw_bytes: int, esc8_bytes: int, esc4_bytes: int) -> tuple[int, int]:
    """``(code, bytes)`` of the smallest value code: raw, d8 (k + escapes) or d4 (k / 2 + escapes)."""
    options = [(raw_bytes, VAL_RAW), (k + esc8_bytes, VAL_D8), (-(-k // 2) + esc4_bytes, VAL_D4)]
    size, code = min(options)
    return code, size


def encode_codes(codes: torch.Tensor, code: int) -> torch.Tensor:
    """int8 codes (:func:`codes8`) as bytes: one per element (d8, escapes stay saturated) or a nibble
    per element (d4: -7..7, escapes -8), two per byte, low nibble first."""
    if code == VAL_D8:
        return codes.view(torch.uint8)
    nib = codes.masked_fill(escaped4(codes), D4_ESC).view(torch.uint8) & 0xF
    if nib.numel() % 2:
        nib = torch.cat([nib, torch.zeros(1, dtype=nib.dtype, device=nib.device)])
    pairs = nib.view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def decode_codes(data: torch.Tensor, k: int, code: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`encode_codes`: ``(int8 codes, escape mask)``."""
    if code == VAL_D8:
        if data.numel() != k:
            raise ValueError(f"d8 section of {data.numel()} bytes for {k} values")
        codes = data.view(torch.int8)
        return codes, escaped8(codes)
    if data.numel() != -(-k // 2):
        raise ValueError(f"d4 section of {data.numel()} bytes for {k} values")
    nib = torch.empty(2 * data.numel(), dtype=torch.uint8, device=data.device)
    nib[0::2] = data & 0xF
    nib[1::2] = data >> 4
    codes = ((nib[:k] ^ 8).view(torch.int8) - 8)  # sign-extend 4 bits: 8..15 -> -8..-1
    return codes, codes == D4_ESC
