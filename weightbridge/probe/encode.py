"""Value codes for probing: canonical element ids written as exactly representable floats.

Every canonical element gets a global id ``gid`` (1-based; 0 = "no element"): the
tensors in model order, each in row-major order, ids back to back. This is the
packed ``name_id | coordinates`` index of the reference in mixed radix instead of
bit fields (a bijection to ``(name, coordinates)``, and denser: ``bit_length(total
elements)`` bits instead of ``bits(#names) + sum(bits(dim))``).

An id is split into *chunks* of ``width`` bits; one loader call carries one chunk of
every element. A chunk value ``k`` is carried as the float

    (-1)^s * (1 + m / 2^p) * 2^(e_base + e),   k = s << (p + eb) | e << p | m

with ``p`` mantissa bits and ``eb`` exponent bits chosen so that every such value is
a **normal, finite, non-zero number exactly representable in every dtype involved**
(the canonical dtypes fed to the loader and the destination dtypes read back). So:

* no NaN/Inf payloads (which some copies canonicalise), no denormals (which
  flush-to-zero kills), no -0.0; zero is never a code, so zero-filled destinations
  read as "unmapped";
* a plain copy *or a dtype cast* (bf16 -> fp32, fp32 -> bf16, ...) keeps the value, so
  cast elements decode to their true source instead of being mis-mapped;
* anything else the loader does (scaling, adding, quantising) yields either an invalid
  code (reported) or a wrong id, which the verification pass with real weights catches
  (reported as changed numerically).

Decoding reads the destination values as float64 (exact for every supported dtype)
and inverts the formula; elements that are not a valid code are marked invalid.

Assumption (documented in docs/probing.md): the loader moves values, possibly through
dtype casts that are exact for these codes; it does not branch on the values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

# dtype -> (mantissa bits, smallest normal exponent, largest exponent used).
# The largest exponent is one below the format's top to stay clear of e4m3fn's NaN code.
FLOAT_FORMATS: dict[torch.dtype, tuple[int, int, int]] = {
    torch.float64: (52, -1022, 1022),
    torch.float32: (23, -126, 126),
    torch.bfloat16: (7, -126, 126),
    torch.float16: (10, -14, 14),
}
if hasattr(torch, "float8_e4m3fn"):
    FLOAT_FORMATS[torch.float8_e4m3fn] = (3, -6, 7)
if hasattr(torch, "float8_e5m2"):
    FLOAT_FORMATS[torch.float8_e5m2] = (2, -14, 14)

UNMAPPED = 0  # decoded chunk/id of an element nothing was written to
INVALID = -1  # decoded value that is not a code (changed numerically, or garbage)


def is_probe_dtype(dtype: torch.dtype) -> bool:
    """True for the floating dtypes codes can be carried in."""
    return dtype in FLOAT_FORMATS


@dataclass(frozen=True)
class CodeBook:
    """The code values shared by a set of dtypes: ``width`` bits per chunk."""

    mant_bits: int
    exp_bits: int
    exp_base: int

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.mant_bits

    @classmethod
    def for_dtypes(cls, dtypes: Iterable[torch.dtype]) -> CodeBook:
        fmts = [FLOAT_FORMATS[d] for d in set(dtypes) if d in FLOAT_FORMATS]
        if not fmts:
            raise ValueError("no floating dtype to carry probe codes in")
        p = min(f[0] for f in fmts)
        lo = max(f[1] for f in fmts)
        hi = min(f[2] for f in fmts)
        span = hi - lo + 1
        eb = max(0, span.bit_length() - 1)  # 2^eb exponents fit in [lo, hi]
        eb = min(eb, 8)  # more exponent bits buy little and reach extreme magnitudes
        n = 1 << eb
        base = min(max(-(n // 2), lo), hi - n + 1)  # centred on 2^0 where possible
        return cls(p, eb, base)

    def chunks(self, total_ids: int) -> int:
        """Chunks needed for ids ``1..total_ids``."""
        bits = max(1, int(total_ids).bit_length())
        return -(-bits // self.width)

    def encode(self, k: torch.Tensor) -> torch.Tensor:
        """Chunk values (int64, ``0 <= k < 2^width``) -> float64 code values (built as float64 bits)."""
        p, eb = self.mant_bits, self.exp_bits
        m = k & ((1 << p) - 1)
        e = ((k >> p) & ((1 << eb) - 1)) + (self.exp_base + 1023)
        s = (k >> (p + eb)) & 1
        return ((s << 63) | (e << 52) | (m << (52 - p))).view(torch.float64)

    def decode(self, v: torch.Tensor) -> torch.Tensor:
        """Destination values (any float dtype) -> chunk values (int64).

        Returns ``-2`` where the value is exactly zero (nothing written), ``INVALID`` (-1) where it
        is not a code, else the chunk value.
        """
        p, eb = self.mant_bits, self.exp_bits
        bits = v.detach().to(torch.float64).view(torch.int64)
        mag = bits & 0x7FFF_FFFF_FFFF_FFFF
        e = (mag >> 52) - (self.exp_base + 1023)  # NaN/Inf/denormal exponents fall outside [0, 2^eb)
        low = mag & ((1 << (52 - p)) - 1)
        ok = (e >= 0) & (e < (1 << eb)) & (low == 0)
        k = (((bits >> 63) & 1) << (p + eb)) | (e.clamp(0, (1 << eb) - 1) << p) | ((mag >> (52 - p)) & ((1 << p) - 1))
        k = torch.where(ok, k, INVALID)
        return torch.where(mag == 0, -2, k)

    # ---- fast paths: lookup tables for narrow codes and narrow destinations ----

    def encode_as(self, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``encode(k).to(dtype)``; a table lookup when codes are at most 16 bits wide."""
        if self.width > 16:
            return self.encode(k).to(dtype)
        return _encode_table(self, dtype)[k]

    def decode_fast(self, v: torch.Tensor) -> torch.Tensor:
        """:meth:`decode`; a table lookup for 1- and 2-byte destination dtypes."""
        size = v.element_size()
        if size > 2:
            return self.decode(v)
        bits = v.detach().contiguous().view(torch.uint8 if size == 1 else torch.int16).to(torch.int64)
        return _decode_table(self, v.dtype)[bits & ((1 << (8 * size)) - 1)]


_TABLES: dict = {}


def _encode_table(book: CodeBook, dtype: torch.dtype) -> torch.Tensor:
    key = ("enc", book, dtype)
    if key not in _TABLES:
        _TABLES[key] = book.encode(torch.arange(1 << book.width, dtype=torch.int64)).to(dtype)
    return _TABLES[key]


def _decode_table(book: CodeBook, dtype: torch.dtype) -> torch.Tensor:
    key = ("dec", book, dtype)
    if key not in _TABLES:
        size = torch.empty((), dtype=dtype).element_size()
        raw = torch.arange(1 << (8 * size), dtype=torch.int64)
        raw = raw.to(torch.uint8) if size == 1 else raw.to(torch.int16)  # wraps to the bit patterns
        _TABLES[key] = book.decode(raw.view(dtype))
    return _TABLES[key]
