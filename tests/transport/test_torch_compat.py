"""The one module of private torch/vLLM APIs: every one present in the tested torch, a missing one named."""

from __future__ import annotations

import warnings

import pytest
import torch

from weightbridge import _torch_compat as compat


def test_every_private_torch_api_the_library_uses_is_present_in_the_tested_torch() -> None:
    assert compat.TORCH_TESTED, f"torch {torch.__version__} is not the tested {compat.TESTED['torch']}: re-check APIS"
    found = compat.check()
    assert {a.name for a in compat.APIS if a.package == "torch"} == set(found)
    assert [name for name, ok in found.items() if ok is False] == []
    # NCCL APIs apply only to builds with NCCL (this CPU build has none)
    assert found["ProcessGroupNCCL.Options.config.blocking"] is (True if compat.nccl_available() else None)


def test_a_missing_api_is_named_with_both_versions(monkeypatch) -> None:
    monkeypatch.setitem(compat.PRESENT, "Backend._start_coalescing", False)
    with pytest.raises(compat.UnsupportedTorch, match=r"Backend._start_coalescing, which torch .* lacks \(tested with "
                                                      r"torch 2.13\)"):
        compat.start_coalescing(object())
    monkeypatch.setattr(compat, "_present", lambda api: False if api.name == "Tensor._version" else True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compat.check()
    assert [str(w.message).split(" (")[0] for w in seen] == [f"torch {torch.__version__} lacks Tensor._version"]


def test_fallbacks_where_one_exists(monkeypatch) -> None:
    t = torch.zeros(3)
    t.add_(1)
    assert compat.version_counter(t) == 1
    with torch.inference_mode():
        assert compat.version_counter(torch.zeros(2)) is None  # inference tensors keep no counter
    monkeypatch.setitem(compat.PRESENT, "Tensor._version", False)
    assert compat.version_counter(t) is None
    dst, src = [torch.zeros(2), torch.zeros(3, dtype=torch.bfloat16)], [torch.ones(2), torch.full((3,), 2.0)]
    compat.foreach_copy(dst, src)
    assert dst[0].tolist() == [1, 1] and dst[1].tolist() == [2, 2, 2]
    monkeypatch.setitem(compat.PRESENT, "torch._foreach_copy_", False)
    compat.foreach_copy([dst[0]], [torch.full((2,), 5.0)])
    assert dst[0].tolist() == [5, 5]
    monkeypatch.setitem(compat.PRESENT, "ProcessGroupGloo._Options", False)
    assert compat.gloo_options(None, "127.0.0.1") is None  # the caller uses the public constructor


def test_the_vllm_registry_is_read_where_it_is() -> None:
    class Factory:
        _registry = {"weightbridge": object}

    assert compat.vllm_engine_registered(Factory, "weightbridge")
    assert not compat.vllm_engine_registered(Factory, "nccl")
