"""The streaming reload's loader without vLLM: which parameters take a streamed tensor itself (issue 28).

vLLM's layerwise reload calls the loader twice per tensor: once on its recorded meta parameter under a
copy-counting dispatch mode (``get_numel_loaded``), once on the parameter it materialised for the
module's processing. Only the second may adopt the tensor; a recorded parameter (meta, or a live kernel
tensor such as a ``bias``, whose storage the engine keeps) is always copied into. The real path, bitwise
into vLLM, is tests/vllm_engine/test_vllm_integration.py; the memory it saves, bench/rollout_memory.py.
"""

from __future__ import annotations

import torch

from weightbridge.integrations.vllm.reload import ReloadSession


def _session(adopt: bool) -> ReloadSession:
    return ReloadSession(torch.nn.Linear(4, 4), None, adopt=adopt)


def test_a_materialised_parameter_takes_the_streamed_tensor_itself():
    s = _session(adopt=True)
    param, streamed = torch.nn.Parameter(torch.empty(4, 4), requires_grad=False), torch.randn(4, 4)
    s.loader(param, streamed)
    assert param.data_ptr() == streamed.data_ptr()  # no second copy


def test_recorded_parameters_and_unfit_tensors_are_copied_into():
    s = _session(adopt=True)
    live_bias = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    s._swapped.add(id(live_bias))  # what _load records: the engine keeps this storage
    streamed = torch.randn(4)
    s.loader(live_bias, streamed)
    assert live_bias.data_ptr() != streamed.data_ptr() and torch.equal(live_bias, streamed)
    meta = torch.nn.Parameter(torch.empty(4, 4, device="meta"), requires_grad=False)
    s.loader(meta, torch.randn(4, 4))  # vLLM's counting pass: a copy_ it can count, no storage
    assert meta.is_meta
    for other in (torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4).t()):  # another dtype, not contiguous
        p = torch.nn.Parameter(torch.empty(4, 4), requires_grad=False)
        s.loader(p, other)
        assert p.data_ptr() != other.data_ptr() and torch.equal(p, other.to(p.dtype))


def test_without_adopt_every_tensor_is_copied():
    s = _session(adopt=False)
    param, staged = torch.nn.Parameter(torch.empty(4, 4), requires_grad=False), torch.randn(4, 4)
    s.loader(param, staged)  # a staging copy is kept and reused: never aliased into the engine
    assert param.data_ptr() != staged.data_ptr() and torch.equal(param, staged)
