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
        """Chunk values (int64, ``0 <= k < 2^width``) -> float64 code values."""
        p, eb = self.mant_bits, self.exp_bits
        m = (k & ((1 << p) - 1)).to(torch.float64)
        e = (k >> p) & ((1 << eb) - 1)
        s = (k >> (p + eb)) & 1
        val = torch.ldexp(1.0 + m / float(1 << p), (e + self.exp_base).to(torch.float64))
        return torch.where(s.bool(), -val, val)

    def decode(self, v: torch.Tensor) -> torch.Tensor:
        """Destination values (any float dtype) -> chunk values (int64); UNMAPPED-style -2 for zero, INVALID for non-codes.

        Returns ``-2`` where the value is exactly zero (nothing written), ``INVALID`` (-1) where it
        is not a code, else the chunk value.
        """
        x = v.detach().to(torch.float64)
        zero = x == 0
        mant, ex = torch.frexp(x.abs())  # x = mant * 2^ex, mant in [0.5, 1)
        f = mant * 2.0 - 1.0  # in [0, 1)
        m_real = f * float(1 << self.mant_bits)
        m = m_real.floor()
        e = ex.to(torch.int64) - 1 - self.exp_base
        ok = torch.isfinite(x) & ~zero & (m == m_real) & (e >= 0) & (e < (1 << self.exp_bits))
        k = (x < 0).to(torch.int64) << (self.mant_bits + self.exp_bits)
        k = k | (e.clamp(0, (1 << self.exp_bits) - 1) << self.mant_bits) | m.clamp(0).to(torch.int64)
        k = torch.where(ok, k, torch.full_like(k, INVALID))
        return torch.where(zero, torch.full_like(k, -2), k)
