"""The one conversion between IR dtype names and torch dtypes (``weightbridge.tensors``)."""

from __future__ import annotations

import pytest
import torch

from weightbridge.layout.ir import DTYPE_BYTES, normalize_dtype
from weightbridge.tensors import dtype_name, torch_dtype


@pytest.mark.parametrize("name", sorted(DTYPE_BYTES))
def test_every_ir_dtype_round_trips(name: str) -> None:
    if not hasattr(torch, name):
        pytest.skip(f"this torch build has no {name}")
    dt = torch_dtype(name)
    assert isinstance(dt, torch.dtype) and dt.itemsize == DTYPE_BYTES[name]
    assert dtype_name(dt) == name and normalize_dtype(dtype_name(dt)) == name
    assert torch_dtype(f"torch.{name}") is dt  # str(torch dtype) is accepted too


def test_unknown_dtype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unsupported dtype 'complex32'"):
        torch_dtype("complex32")
