"""Probe SGLang's own ``load_weights`` inside a worker (the check itself: :mod:`.._engine.probing`).

Runs in the SGLang worker (the ``init`` command of :mod:`.worker`). A second instance of the
worker's model class (same HF config, quantisation config and parallel state; built in host
memory, never on the engine's device) is probed with :func:`weightbridge.probe.probe_loader` through its
``load_weights`` (HF names in, as SGLang loads a checkpoint) and freed. Tied aliases are dropped by
``named_parameters()``'s identity de-duplication. The result is cached on disk by a key of
everything it depends on (SGLang version, model class, HF config, dtype, parallel sizes, TP
rank, canonical tensors), so later engine starts read it back instead of probing.

Memory: while probing, the copy is one more model shard in host memory plus the probe's decode
state (``docs/memory.md``), none on the device; to skip it, probe once where there is room, pin
the fingerprints in the spec and pass ``probe="off"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from weightbridge.integrations._engine import probing as common
from weightbridge.layout.ir import RankLayout

CACHE_ENV = common.CACHE_ENV


def default_cache_dir() -> Path:
    return common.default_cache_dir("sglang-probe")


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype SGLang built the model in (the most common floating dtype of its parameters)."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=lambda d: counts[d]) if counts else torch.get_default_dtype()


def probe_key(model: torch.nn.Module, par: dict[str, int], canonical: Any) -> str:
    """Everything the probe result depends on, hashed."""
    import sglang

    cfg = model.config
    return common.probe_key_of({
        "sglang": sglang.__version__,
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "hf_config": cfg.to_dict() if hasattr(cfg, "to_dict") else str(cfg),
        "quant": str(getattr(model, "quant_config", None)),
        "dtype": str(model_dtype(model)),
        "parallel": par,
        "canonical": common.canonical_parts(canonical),
    })


def fresh_model(model: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    """A second instance of the worker's model class, checkpoint format, nothing loaded.

    Built as SGLang's ``_initialize_model`` builds it (model class, HF config, quantisation
    config, shared-experts resolution) in the model's dtype, on ``device`` (default: the model's)."""
    from sglang.srt.model_loader.loader import resolve_shared_experts_config
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_model

    cls = type(model)
    quant = getattr(model, "quant_config", None)
    shared = resolve_shared_experts_config(cls, model.config, quant)
    device = next(model.parameters()).device if device is None else device
    with set_default_torch_dtype(model_dtype(model)), torch.device(device), get_model().override(shared_experts=shared):
        copy = cls(config=model.config, quant_config=quant)
    copy.shared_experts_config = shared
    return copy


def probe_sglang_worker(model: torch.nn.Module, canonical: Any, layout: RankLayout) -> Any:
    """Probe a fresh copy of the worker's model class; returns a :class:`ProbeResult`."""
    probe_model = fresh_model(model, common.PROBE_DEVICE)  # dropped on return: nothing below keeps a reference

    def load_weights(weights: Any) -> Any:
        with torch.no_grad():
            return probe_model.load_weights(weights)

    return common.probe_model(canonical, layout, load_weights, lambda: dict(probe_model.named_parameters()))


def check_against_engine(model: torch.nn.Module, par: dict[str, int], me: str, resolved: Any, layout: RankLayout,
                         *, cache_dir: str | None = None) -> RankLayout:
    """The probed layout of this worker's loader (cached); ``EngineMismatch`` unless it is the spec's."""
    return common.check_against_engine(
        me, "SGLang", resolved, layout, key=probe_key(model, par, resolved.canonical),
        cache=Path(cache_dir) if cache_dir else default_cache_dir(),
        probe=lambda: probe_sglang_worker(model, resolved.canonical, layout),
    )
