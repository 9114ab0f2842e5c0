"""FP8 rollout targets in a vLLM worker: the engine's own quantised format, and FP8 writes into online layers.

Runs in vLLM worker processes (the weight-transfer engine calls it). Frames: the worker's local
tensors in checkpoint format (:mod:`weightbridge.integrations.vllm.reload`); quantised weights as in
:mod:`weightbridge.layout.quant` (a local weight ``X.weight`` / ``X.w13_weight`` and its scale tensor
``X.weight_scale_inv`` / ``X.w13_weight_scale_inv``).

* :func:`engine_format`: what the engine serves quantised, read from the live model (every module
  whose weight is ``float8_e4m3fn``): weight name, dtype and checkpoint-format shape, the scale
  tensor's name, dtype and shape, the block and the method (online: the engine quantises bf16 it
  loads; checkpoint: it loads FP8). :func:`format_problems` compares it with the spec's rollout
  layout for this rank: a mismatch refuses the init before any byte moves.
* :class:`OnlineFp8Writes`: weights quantised at the sender arriving at an engine that quantises
  online (``quantization="fp8_per_block"``). vLLM's reload would feed them to the layer's loader as
  bf16 and quantise; instead the whole layer is written here: its FP8 values and scales take the
  place of vLLM's own quantiser output, then the method's remaining post-processing runs as at
  load (the CPU kernel's prepacking, the MoE kernel setup) and the result is copied into the
  kernel tensors the engine runs on, as vLLM's layerwise reload does. Bitwise equal to vLLM's own
  load because the sender's quantiser is vLLM's (``weightbridge.quant``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from weightbridge.layout.ir import RankLayout

FP8 = torch.float8_e4m3fn
WEIGHTS = ("weight", "w13_weight", "w2_weight")  # the quantised params of linear and fused-MoE layers


def _scale_param(mod: torch.nn.Module, weight: str) -> tuple[str, torch.Tensor] | None:
    for suffix in ("_scale_inv", "_scale"):
        t = getattr(mod, weight + suffix, None)
        if isinstance(t, torch.Tensor):
            return weight + suffix, t
    return None


def _block(mod: torch.nn.Module) -> list[int] | None:
    qm = getattr(mod, "quant_method", None)
    block = getattr(qm, "weight_block_size", None) or getattr(mod, "weight_block_size", None)
    if block is None:
        block = getattr(getattr(qm, "quant_config", None), "weight_block_size", None)
    return [int(b) for b in block] if block else None


def engine_format(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Local weight name -> ``{"dtype", "shape", "scale", "scale_dtype", "scale_shape", "block",
    "method", "online"}`` for every FP8 weight of the live ``model``; plain data (the probe reports it)."""
    from vllm.model_executor.layers.quantization.online.fp8 import OnlineLinearBase
    from vllm.model_executor.layers.quantization.online.moe_base import OnlineMoEMethodBase
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    out: dict[str, dict[str, Any]] = {}
    for name, mod in model.named_modules():
        for w in WEIGHTS:
            t = mod._parameters.get(w)
            if t is None or t.dtype != FP8:
                continue
            scale = _scale_param(mod, w)
            restored = get_layerwise_info(mod).restore_metadata[0].get(w)  # checkpoint format, recorded at load
            qm = getattr(mod, "quant_method", None)
            out[f"{name}.{w}"] = {
                "dtype": "float8_e4m3fn",
                "shape": list((restored if restored is not None else t).shape),
                "scale": f"{name}.{scale[0]}" if scale else None,
                "scale_dtype": str(scale[1].dtype).removeprefix("torch.") if scale else None,
                "scale_shape": list(scale[1].shape) if scale else None,
                "block": _block(mod),
                "method": type(qm).__name__,
                "online": isinstance(qm, (OnlineLinearBase, OnlineMoEMethodBase)),
            }
    return dict(sorted(out.items()))


def expected_format(layout: RankLayout) -> dict[str, dict[str, Any]]:
    """What :func:`engine_format` must say for the spec's rollout ``layout`` (FP8 local tensors and
    their scale tensors: :func:`weightbridge.layout.quant.quantize_rollout`'s result)."""
    by = {t.name: t for t in layout.tensors}
    out = {}
    for t in layout.tensors:
        if t.dtype != "float8_e4m3fn":
            continue
        scale = by.get(t.name + "_scale_inv") or by.get(t.name + "_scale")
        out[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "scale": scale.name if scale else None,
                       "scale_dtype": scale.dtype if scale else None,
                       "scale_shape": list(scale.shape) if scale else None}
    return out


def format_problems(engine: Mapping[str, Mapping[str, Any]], expected: Mapping[str, Mapping[str, Any]],
                    block: tuple[int, int] | None) -> list[str]:
    """How the engine's quantised format differs from the spec's (empty: the same). ``block``: the
    spec's block (None: per row)."""
    out = []
    for name in sorted(set(engine) - set(expected)):
        e = engine[name]
        out.append(f"{name}: the engine serves it as FP8 ({e['method']}, block {e['block']}), the spec as unquantised")
    for name in sorted(set(expected) - set(engine)):
        out.append(f"{name}: the spec says FP8, the engine serves it unquantised")
    for name in sorted(set(engine) & set(expected)):
        e, x = engine[name], expected[name]
        for key in ("shape", "scale", "scale_dtype", "scale_shape"):
            if e[key] != x[key]:
                out.append(f"{name}: {key} {e[key]} in the engine, {x[key]} in the spec")
        if block is not None and e["block"] is not None and list(e["block"]) != list(block):
            out.append(f"{name}: {e['block'][0]}x{e['block'][1]} blocks in the engine, {block[0]}x{block[1]} in the spec")
    return out


class OnlineFp8Writes:
    """Writes FP8 values and scales into the online-quantised layers of one reload (module docstring).

    Used by :class:`~weightbridge.integrations.vllm.reload.ReloadSession` between vLLM's
    ``initialize_layerwise_reload`` and ``finalize_layerwise_reload``: :meth:`take` removes, from
    each ``write``, every tensor of a layer it handles and writes that layer once all its tensors
    arrived; layers it handled are done before finalisation (vLLM then skips them).
    """

    def __init__(self, model: torch.nn.Module, names: set[str]) -> None:
        """``names``: the local FP8 weight names this worker receives (its layout's FP8 tensors)."""
        from vllm.model_executor.layers.quantization.online.fp8 import Fp8PerBlockOnlineLinearMethod
        from vllm.model_executor.layers.quantization.online.fp8 import Fp8PerBlockOnlineMoEMethod

        self.layers: dict[str, torch.nn.Module] = {}
        for mname, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            if isinstance(qm, (Fp8PerBlockOnlineLinearMethod, Fp8PerBlockOnlineMoEMethod)) and any(
                    f"{mname}.{w}" in names for w in WEIGHTS):
                self.layers[mname] = mod
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def take(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Write what belongs to handled layers (once a layer is complete); return the rest."""
        rest = {}
        for name, t in tensors.items():
            mname, _, pname = name.rpartition(".")
            if mname in self.layers:
                self.pending.setdefault(mname, {})[pname] = t
            else:
                rest[name] = t
        for mname in list(self.pending):
            if self._complete(mname):
                self._write(mname, self.pending.pop(mname))
        return rest

    def unfinished(self) -> list[str]:
        return sorted(self.pending)

    def _complete(self, mname: str) -> bool:
        """Every parameter of the layer arrived (its FP8 weights, their scales, any others: a bias)."""
        mod, got = self.layers[mname], self.pending[mname]
        need = {p for p, t in mod._parameters.items() if t is not None and not p.endswith(("_scale", "_scale_inv"))}
        need |= {w + "_scale_inv" for w in WEIGHTS if w in mod._parameters}
        return need <= set(got)

    @torch.no_grad()
    def _write(self, mname: str, got: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.layers.quantization.online.fp8 import Fp8PerBlockOnlineMoEMethod
        from vllm.model_executor.model_loader.reload.layerwise import (
            _copy_and_restore_kernel_tensors,
            _get_original_loader,
            get_layerwise_info,
        )
        from vllm.model_executor.model_loader.reload.meta import materialize_layer
        from vllm.model_executor.model_loader.reload.utils import get_layer_tensors
        from vllm.model_executor.utils import replace_parameter

        mod = self.layers[mname]
        qm = mod.quant_method
        info = get_layerwise_info(mod)
        for t in get_layer_tensors(mod).values():  # as vLLM's _layerwise_process: the plain loaders back
            t.weight_loader = _get_original_loader(t)
        materialize_layer(mod, info)
        for pname, t in got.items():  # everything but the FP8 weights and scales: plain checkpoint tensors
            if pname not in WEIGHTS and not pname.endswith("_scale_inv"):
                getattr(mod, pname).data.copy_(t)
        if hasattr(mod, "_already_called_process_weights_after_loading"):
            delattr(mod, "_already_called_process_weights_after_loading")
        if isinstance(qm, Fp8PerBlockOnlineMoEMethod):
            # Fp8PerBlockOnlineMoEMethod.process_weights_after_loading, its quantiser's output given
            mod.weight_block_size = qm.weight_block_size
            qm._setup_kernel(mod, got["w13_weight"].clone(), got["w2_weight"].clone(),
                             got["w13_weight_scale_inv"].clone(), got["w2_weight_scale_inv"].clone(),
                             mod.w13_input_scale, mod.w2_input_scale)
        else:
            # Fp8PerBlockOnlineLinearMethod.process_weights_after_loading, its quantiser's output given
            mod.input_scale = None
            replace_parameter(mod, "weight", got["weight"].clone())
            replace_parameter(mod, "weight_scale_inv", got["weight_scale_inv"].clone())
            qm.fp8_linear.process_weights_after_loading(mod)
        mod._already_called_process_weights_after_loading = True
        if hasattr(mod, "update_param_tp_status"):
            mod.update_param_tp_status()
        _copy_and_restore_kernel_tensors(mod, info)
        info.reset()
