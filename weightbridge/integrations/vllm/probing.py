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

Quantised engines (:mod:`.fp8`): an engine that quantises online (``quantization="fp8_per_block"``)
is probed as an unquantised copy (its loader takes bf16 checkpoints), and the spec's FP8 receive
tensors are compared with that layout quantised as the spec says; an engine loading an FP8
checkpoint is probed with FP8 weights and their scales. Either way the engine's own quantised
format (:func:`.fp8.engine_format`) must then equal the spec's, else the init is refused.
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


def online_quantized(vllm_config: Any) -> bool:
    """The engine quantises the (unquantised) weights it loads itself (vLLM's online quantisation)."""
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    return isinstance(vllm_config.quant_config, OnlineQuantizationConfig)


def probe_key(vllm_config: Any, rank: int, canonical: Any) -> str:
    """Everything the probe result depends on, hashed."""
    import vllm

    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    return common.probe_key_of({
        "unquantized": online_quantized(vllm_config),
        "vllm": vllm.__version__,
        "arch": list(getattr(mc.hf_config, "architectures", None) or []),
        "hf_config": mc.hf_config.to_dict(),
        "dtype": str(mc.dtype),
        "tp": pc.tensor_parallel_size,
        "pp": pc.pipeline_parallel_size,
        "rank": rank,
        "canonical": common.canonical_parts(canonical),
    })


def fresh_model(vllm_config: Any, device: torch.device, *, unquantized: bool = False) -> torch.nn.Module:
    """A second instance of the worker's model class, checkpoint format, nothing loaded
    (``unquantized``: without the engine's quantisation)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    cfg = copy.copy(vllm_config)
    if unquantized:
        cfg.quant_config = None
    # A private forward context: the copy's attention layers must not collide with the live
    # model's names ("Duplicate layer name").
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.static_forward_context = {}
    with set_current_vllm_config(cfg), set_default_torch_dtype(cfg.model_config.dtype), torch.device(device):
        return initialize_model(vllm_config=cfg, prefix="")


def probe_vllm_worker(vllm_config: Any, device: torch.device, canonical: Any, layout: RankLayout) -> Any:
    """Probe a fresh copy of the worker's model class (unquantised when the engine quantises online)
    with ``canonical``'s tensors; returns a :class:`ProbeResult`."""
    from vllm.config import set_current_vllm_config

    model = fresh_model(vllm_config, device, unquantized=online_quantized(vllm_config))

    def load_weights(weights: Any) -> Any:
        with set_current_vllm_config(vllm_config), torch.no_grad():
            return model.load_weights(weights)

    return common.probe_model(canonical, layout, load_weights, lambda: dict(model.named_parameters()))


def check_against_engine(engine: Any, me: str, resolved: Any, layout: RankLayout, *,
                         cache_dir: str | None = None) -> RankLayout:
    """The probed layout of this worker's loader (cached); ``EngineMismatch`` unless it is the spec's,
    and unless the engine's quantised format is the spec's (module docstring)."""
    from weightbridge.layout.quant import stored, unquantized

    online = online_quantized(engine.vllm_config)
    # what the probed loader is fed: bf16 checkpoints (online), else the checkpoint as stored (FP8 weights)
    canonical = unquantized(resolved.canonical) if online else stored(resolved.canonical)
    key = probe_key(engine.vllm_config, engine.parallel_config.rank, canonical)
    probed = common.check_against_engine(
        me, "vLLM", resolved, layout, key=key, cache=Path(cache_dir) if cache_dir else default_cache_dir(),
        probe=lambda: probe_vllm_worker(engine.vllm_config, torch.device(common.PROBE_DEVICE), canonical, layout),
        served=(lambda p: served_layout(p, resolved)) if online and resolved.canonical.quant else None,
    )
    check_format(engine, me, resolved, layout)
    return probed


def served_layout(probed: RankLayout, resolved: Any) -> RankLayout:
    """The receive tensors of an online-quantising engine's rank probed unquantised, when the sender
    quantises: its quantised weights FP8 with their scale tensors (as the spec's rollout layout)."""
    from weightbridge.layout.ir import SideLayout
    from weightbridge.layout.quant import quantize_rollout

    side, _ = quantize_rollout(SideLayout("rollout", (probed,)), resolved.canonical)
    return side.ranks[0]


def check_format(engine: Any, me: str, resolved: Any, layout: RankLayout) -> None:
    """``EngineMismatch`` unless the FP8 weights the engine serves (names, shapes, scale tensors,
    block) are those the spec says: its rollout layout's FP8 tensors, or with ``at: engine`` the
    declared quantisation applied to the layout."""
    from weightbridge.errors import EngineMismatch
    from weightbridge.integrations.vllm.fp8 import engine_format, expected_format, format_problems
    from weightbridge.layout.ir import SideLayout
    from weightbridge.layout.quant import quantize_rollout
    from weightbridge.spec.quant import engine_model, scheme_of

    decl = resolved.spec.rollout.quantization
    expect, block = layout, None
    if resolved.canonical.quant:
        sch = resolved.canonical.quant[0].scheme
        block = sch.block if sch.kind == "block" else None
    elif decl is not None:  # at: engine: the engine quantises what the spec declares
        side, _ = quantize_rollout(SideLayout("rollout", (layout,)), engine_model(resolved.canonical, decl))
        expect, sch = side.ranks[0], scheme_of(decl)
        block = sch.block if sch.kind == "block" else None
    problems = format_problems(engine_format(engine.model), expected_format(expect), block)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise EngineMismatch(me, "the engine's quantised weights differ from the spec's rollout.quantization: "
                                 + "; ".join(problems[:5]) + more
                                 + " (declare what the engine serves: rollout.quantization, its weights/exclude)")
