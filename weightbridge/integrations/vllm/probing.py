"""Probe vLLM's own ``load_weights`` inside a worker and check the spec's layout against it.

Runs in the worker process (``WeightbridgeEngine.init_transfer_engine``). A second copy of the
model class is built on the worker's device (the live model's checkpoint-format parameters no
longer exist after post-processing), probed with :func:`weightbridge.probe.probe_loader` through
its ``load_weights`` (HF names in, as vLLM loads a checkpoint), and freed. Aliases (a tied
``lm_head``, ``mlp.experts.gate`` = ``mlp.gate``) are dropped by ``named_parameters()``'s
identity de-duplication. The result is cached on disk by a key of everything it depends on
(vLLM version, model class, HF config, dtype, parallel sizes, worker rank, canonical tensors), so
later engine starts read it back instead of probing.

Memory: the copy is one more model shard on the device while probing. For models too large for
that, probe once on a machine that has room, pin the fingerprints in the spec and pass
``probe="off"``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from weightbridge.errors import BridgeError
from weightbridge.layout.ir import RankLayout
from weightbridge.layout.normalize import layout_fingerprint

log = logging.getLogger(__name__)

CACHE_ENV = "WEIGHTBRIDGE_CACHE_DIR"


class EngineMismatch(BridgeError):
    """The spec does not describe this vLLM engine (mesh, layout or pinned fingerprint); names the rank."""

    def __init__(self, rank: str, message: str) -> None:
        self.rank = rank
        self.message = message
        super().__init__(f"{rank}: {message}")


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "weightbridge")
    return Path(root) / "vllm-probe"


def probe_key(vllm_config: Any, rank: int, canonical: Any) -> str:
    """Everything the probe result depends on, hashed."""
    import vllm

    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    parts = {
        "format": 1,
        "vllm": vllm.__version__,
        "arch": list(getattr(mc.hf_config, "architectures", None) or []),
        "hf_config": mc.hf_config.to_dict(),
        "dtype": str(mc.dtype),
        "tp": pc.tensor_parallel_size,
        "pp": pc.pipeline_parallel_size,
        "rank": rank,
        "canonical": [(t.name, list(t.shape), t.dtype) for t in canonical.tensors],
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


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

    from weightbridge.probe import probe_loader

    model = fresh_model(vllm_config, device)

    def load_weights(weights: Any) -> Any:
        with set_current_vllm_config(vllm_config), torch.no_grad():
            return model.load_weights(weights)

    return probe_loader(
        canonical, load_weights, lambda: dict(model.named_parameters()), side="rollout", rank=layout.rank,
        instance=layout.instance, local_rank=layout.local_rank, coords=dict(layout.coords),
    )


def check_against_engine(engine: Any, resolved: Any, layout: RankLayout, *, cache_dir: str | None = None) -> RankLayout:
    """Probe (or read the cached probe of) this worker's loader; raise ``EngineMismatch`` unless it
    equals the spec's layout for this rank and any pinned fingerprint. Returns the probed layout."""
    from weightbridge.probe import read_probe_json, write_probe_json
    from weightbridge.probe.diff import diff_layouts, format_diff

    rank = engine.parallel_config.rank
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"{probe_key(engine.vllm_config, rank, resolved.canonical)}.json"
    probed: RankLayout | None = None
    if path.is_file():
        try:
            probed = read_probe_json(path)
            log.info("weightbridge: %s: probe read from cache %s", engine.me, path)
        except (ValueError, KeyError) as exc:
            log.warning("weightbridge: %s: ignoring unreadable probe cache %s (%s)", engine.me, path, exc)
    if probed is None:
        res = probe_vllm_worker(engine.vllm_config, engine.device, resolved.canonical, layout)
        if not res.ok:
            raise EngineMismatch(engine.me, f"probing vLLM's load_weights gave no clean layout:\n{res.summary()}")
        cache.mkdir(parents=True, exist_ok=True)
        write_probe_json(res, path)
        probed = res.layout
        log.info("weightbridge: %s: probed vLLM's loader (%s), cached at %s", engine.me, res.summary(), path)
    diffs = diff_layouts(layout, probed)
    if diffs:
        raise EngineMismatch(
            engine.me,
            f"the spec's rollout layout (A) differs from what vLLM's load_weights does (B) in {len(diffs)} "
            f"tensor(s):\n{format_diff(diffs, limit=5)}\n(fix the spec's rollout rules; probe JSON: {path})",
        )
    pinned = resolved.spec.rollout.pins.get(layout.local_rank)
    if pinned is not None and layout_fingerprint(probed) != pinned:
        raise EngineMismatch(
            engine.me,
            f"vLLM's loader now gives layout {layout_fingerprint(probed)}, the spec pins {pinned} for rank "
            f"{layout.local_rank}: the engine changed; re-probe and re-pin (probe JSON: {path})",
        )
    return probed
