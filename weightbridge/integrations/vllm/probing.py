"""Probe vLLM's own ``load_weights`` inside a worker (the check itself: :mod:`.._engine.probing`).

Runs in the worker process (``WeightbridgeEngine.init_transfer_engine``). A second copy of the
model class is built in host memory (the live model's checkpoint-format parameters no longer
exist after post-processing; the device's memory is the engine's), probed with
:func:`weightbridge.probe.probe_loader` through its ``load_weights`` (HF names in, as vLLM loads a
checkpoint), and freed. Aliases (a tied
``lm_head``, ``mlp.experts.gate`` = ``mlp.gate``) are dropped by ``named_parameters()``'s
identity de-duplication. The result is cached on disk by a key of everything it depends on
(vLLM version, model class, HF config, dtype, parallel sizes, worker rank, canonical tensors), so
later engine starts read it back instead of probing.

Memory: while probing, the copy is one more model shard in host memory, plus the probe's decode
state (at most ``max_probe_bytes``, 512 MiB) and one canonical tensor at a time (``docs/memory.md``
has the measured numbers); none on the device. Probing runs once per engine version, config and
rank (the cache); to skip it entirely, probe once where there is room, pin the fingerprints in the
spec and pass ``probe="off"``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from weightbridge.integrations._engine import probing as common
from weightbridge.layout.ir import RankLayout

CACHE_ENV = common.CACHE_ENV


def default_cache_dir() -> Path:
    return common.default_cache_dir("vllm-probe")


def probe_key(vllm_config: Any, rank: int, canonical: Any) -> str:
    """Everything the probe result depends on, hashed."""
    import vllm

    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    return common.probe_key_of({
        "vllm": vllm.__version__,
        "arch": list(getattr(mc.hf_config, "architectures", None) or []),
        "hf_config": mc.hf_config.to_dict(),
        "dtype": str(mc.dtype),
        "tp": pc.tensor_parallel_size,
        "pp": pc.pipeline_parallel_size,
        "rank": rank,
        "canonical": common.canonical_parts(canonical),
    })


def fresh_model(vllm_config: Any, device: torch.device) -> torch.nn.Module:
    """A second instance of the worker's model class, checkpoint format, nothing loaded."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = copy.copy(vllm_config)
    # A private forward context: the copy's attention layers must not collide with the live
    # model's names ("Duplicate layer name").
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.static_forward_context = {}
    with set_current_vllm_config(cfg), set_default_torch_dtype(cfg.model_config.dtype), torch.device(device):
        return initialize_model(vllm_config=cfg, prefix="")


def probe_vllm_worker(vllm_config: Any, device: torch.device, canonical: Any, layout: RankLayout) -> Any:
    """Probe a fresh copy of the worker's model class; returns a :class:`ProbeResult`."""
    from vllm.config import set_current_vllm_config

    model = fresh_model(vllm_config, device)

    def load_weights(weights: Any) -> Any:
        with set_current_vllm_config(vllm_config), torch.no_grad():
            return model.load_weights(weights)

    return common.probe_model(canonical, layout, load_weights, lambda: dict(model.named_parameters()))


def check_against_engine(engine: Any, me: str, resolved: Any, layout: RankLayout, *,
                         cache_dir: str | None = None) -> RankLayout:
    """The probed layout of this worker's loader (cached); ``EngineMismatch`` unless it is the spec's."""
    key = probe_key(engine.vllm_config, engine.parallel_config.rank, resolved.canonical)
    return common.check_against_engine(
        me, "vLLM", resolved, layout, key=key, cache=Path(cache_dir) if cache_dir else default_cache_dir(),
        probe=lambda: probe_vllm_worker(engine.vllm_config, torch.device(common.PROBE_DEVICE), resolved.canonical,
                                        layout),
    )
