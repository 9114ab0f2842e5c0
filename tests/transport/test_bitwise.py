"""The one bits-equal comparison (``weightbridge.tensors.bitwise_equal``, ``layout_mismatches``): bits, not
values. ``torch.equal`` says ``-0.0 == 0.0`` and ``NaN != NaN``; the demo's "verified bitwise" and every
test's check rest on this instead (issue 27: the old check through the IR used ``torch.equal``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.layout.ir import LocalTensor, Piece, RankLayout
from weightbridge.tensors import bitwise_equal, diff_tensors, layout_mismatches

FLOATS = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.complex64,
          torch.complex128]


def _nan(payload: int) -> torch.Tensor:
    """A float32 quiet NaN carrying ``payload`` in its low mantissa bits."""
    return torch.tensor([0x7FC00000 | payload], dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_negative_zero_is_not_zero(dtype: torch.dtype) -> None:
    pos, neg = torch.zeros(3, dtype=dtype), torch.tensor([0.0, -0.0, 0.0], dtype=dtype)
    assert torch.equal(pos, neg)  # value equality: what the old check used
    assert not bitwise_equal(pos, neg)
    assert diff_tensors({"w": pos}, {"w": neg}) == ["w: 1 of 3 elements differ"]


def test_a_nan_equals_only_the_same_nan() -> None:
    a, b = _nan(1), _nan(2)
    assert not torch.equal(a, a.clone())  # value equality: NaN != NaN
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(a, b)


def test_shape_and_dtype_must_match_and_empty_and_scalar_tensors_compare() -> None:
    assert not bitwise_equal(torch.zeros(4), torch.zeros(2, 2))
    assert not bitwise_equal(torch.zeros(4), torch.zeros(4, dtype=torch.float64))
    assert bitwise_equal(torch.zeros(0, 3), torch.zeros(0, 3))
    assert bitwise_equal(torch.tensor(-0.0), torch.tensor(-0.0)) and not bitwise_equal(torch.tensor(-0.0), torch.tensor(0.0))
    assert bitwise_equal(torch.zeros(3, dtype=torch.complex128), torch.zeros(3, dtype=torch.complex128))


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(FLOATS), n=st.integers(1, 40), seed=st.integers(0, 2**16), bit=st.integers(0, 10**6))
def test_equal_bits_are_equal_and_any_flipped_bit_is_seen(dtype: torch.dtype, n: int, seed: int, bit: int) -> None:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=g)
    a = raw.view(dtype)  # any bit pattern: NaNs with payloads, -0.0, infinities, subnormals
    assert bitwise_equal(a, a.clone())
    flipped = raw.clone()
    flipped[(bit // 8) % raw.numel()] ^= 1 << (bit % 8)
    assert not bitwise_equal(a, flipped.view(dtype))


def test_layout_mismatches_sees_a_negative_zero_in_a_piece() -> None:
    layout = RankLayout("rollout", 0, (LocalTensor("w", (2, 3), "float32", (
        Piece("w", ((0, 2), (0, 3)), ((0, 2), (0, 3)), False),)),))
    canonical = {"w": torch.zeros(2, 3)}
    local = {"w": torch.zeros(2, 3)}
    assert layout_mismatches(layout, local, canonical) == []
    local["w"][1, 2] = -0.0
    assert layout_mismatches(layout, local, canonical) == ["rollout 0 w[0:2, 0:3] != w[0:2, 0:3]"]
