"""Probe SGLang's own ``load_weights`` inside a worker and check the spec's layout against it.

Runs in the SGLang worker (the ``init`` command of :mod:`.worker`). A second instance of the
worker's model class (same HF config, quantisation config and parallel state; built on the
worker's device) is probed with :func:`weightbridge.probe.probe_loader` through its
``load_weights`` (HF names in, as SGLang loads a checkpoint) and freed. Tied aliases are dropped by
``named_parameters()``'s identity de-duplication. The result is cached on disk by a key of
everything it depends on (SGLang version, model class, HF config, dtype, parallel sizes, TP
rank, canonical tensors), so later engine starts read it back instead of probing.

Memory: the copy is one more model shard on the device while probing; for models too large for
that, probe once where there is room, pin the fingerprints in the spec and pass ``probe="off"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from weightbridge.layout.ir import RankLayout
from weightbridge.layout.normalize import layout_fingerprint

log = logging.getLogger(__name__)

CACHE_ENV = "WEIGHTBRIDGE_CACHE_DIR"


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "weightbridge")
    return Path(root) / "sglang-probe"


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
    parts = {
        "format": 1,
        "sglang": sglang.__version__,
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "hf_config": cfg.to_dict() if hasattr(cfg, "to_dict") else str(cfg),
        "quant": str(getattr(model, "quant_config", None)),
        "dtype": str(model_dtype(model)),
        "parallel": par,
        "canonical": [(t.name, list(t.shape), t.dtype) for t in canonical.tensors],
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def fresh_model(model: torch.nn.Module) -> torch.nn.Module:
    """A second instance of the worker's model class, checkpoint format, nothing loaded.

    Built as SGLang's ``_initialize_model`` builds it (model class, HF config, quantisation
    config, shared-experts resolution) in the model's dtype, on its device."""
    from sglang.srt.model_loader.loader import resolve_shared_experts_config
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_model

    cls = type(model)
    quant = getattr(model, "quant_config", None)
    shared = resolve_shared_experts_config(cls, model.config, quant)
    device = next(model.parameters()).device
    with set_default_torch_dtype(model_dtype(model)), torch.device(device), get_model().override(shared_experts=shared):
        copy = cls(config=model.config, quant_config=quant)
    copy.shared_experts_config = shared
    return copy


def probe_sglang_worker(model: torch.nn.Module, canonical: Any, layout: RankLayout) -> Any:
    """Probe a fresh copy of the worker's model class; returns a :class:`ProbeResult`."""
    from weightbridge.probe import probe_loader

    probe_model = fresh_model(model)  # dropped on return: nothing below keeps a reference

    def load_weights(weights: Any) -> Any:
        with torch.no_grad():
            return probe_model.load_weights(weights)

    return probe_loader(
        canonical, load_weights, lambda: dict(probe_model.named_parameters()), side="rollout", rank=layout.rank,
        instance=layout.instance, local_rank=layout.local_rank, coords=dict(layout.coords),
    )


def check_against_engine(receiver: Any, resolved: Any, layout: RankLayout, *,
                         cache_dir: str | None = None) -> RankLayout:
    """Probe (or read the cached probe of) this worker's loader; raise ``EngineMismatch`` unless it
    equals the spec's layout for this rank and any pinned fingerprint. Returns the probed layout."""
    from weightbridge.integrations.sglang.worker import EngineMismatch
    from weightbridge.probe import read_probe_json, write_probe_json
    from weightbridge.probe.diff import diff_layouts, format_diff

    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"{probe_key(receiver.model, receiver.par, resolved.canonical)}.json"
    probed: RankLayout | None = None
    if path.is_file():
        try:
            probed = read_probe_json(path)
            log.info("weightbridge: %s: probe read from cache %s", receiver.me, path)
        except (ValueError, KeyError) as exc:
            log.warning("weightbridge: %s: ignoring unreadable probe cache %s (%s)", receiver.me, path, exc)
    if probed is None:
        res = probe_sglang_worker(receiver.model, resolved.canonical, layout)
        if not res.ok:
            raise EngineMismatch(receiver.me, f"probing SGLang's load_weights gave no clean layout:\n{res.summary()}")
        cache.mkdir(parents=True, exist_ok=True)
        write_probe_json(res, path)
        probed = res.layout
        log.info("weightbridge: %s: probed SGLang's loader (%s), cached at %s", receiver.me, res.summary(), path)
    diffs = diff_layouts(layout, probed)
    if diffs:
        raise EngineMismatch(
            receiver.me,
            f"the spec's rollout layout (A) differs from what SGLang's load_weights does (B) in {len(diffs)} "
            f"tensor(s):\n{format_diff(diffs, limit=5)}\n(fix the spec's rollout rules; probe JSON: {path})",
        )
    pinned = resolved.spec.rollout.pins.get(layout.local_rank)
    if pinned is not None and layout_fingerprint(probed) != pinned:
        raise EngineMismatch(
            receiver.me,
            f"SGLang's loader now gives layout {layout_fingerprint(probed)}, the spec pins {pinned} for rank "
            f"{layout.local_rank}: the engine changed; re-probe and re-pin (probe JSON: {path})",
        )
    return probed
