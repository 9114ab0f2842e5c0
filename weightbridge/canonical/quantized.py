"""Pre-quantised (block-FP8) checkpoints as canonical models.

Frame: a checkpoint whose ``config.json`` says ``quantization_config: {quant_method: fp8,
weight_block_size: [bn, bk]}`` (DeepSeek-V3, Qwen3-*-FP8): its quantised linear weights are stored
``float8_e4m3fn`` and each has a fp32 ``<weight>_scale_inv`` of ``[ceil(N / bn), ceil(K / bk)]``.
In weightbridge's coordinates (:mod:`weightbridge.layout.quant`) such a weight keeps the dtype it is
quantised from (the config's ``torch_dtype``: what a trainer holds) and the model records how it
is stored (``CanonicalModel.quant``), its scale tensors among the tensors.

* :func:`apply_quantization_config` (config sources): the weights quantised are the decoder
  layers' 2-D weights (:func:`~weightbridge.layout.quant.select_weights`' default) minus the
  config's ``modules_to_not_convert`` / ``ignored_layers`` (module names, matched on whole dotted
  components); ``scale_fmt: ue8m0`` means power-of-two scales (stored fp32).
* :func:`from_fp8_header` (safetensors sources with a block-FP8 ``config.json`` beside the files):
  the quantised weights are the ``float8_e4m3fn`` tensors, each with its ``_scale_inv`` sibling.
  Without such a config the headers' tensors are taken as they are (FP8 dtypes and scale tensors
  as plain tensors).

Other ``quant_method`` values are not understood and ignored, as before (the canonical model is the
unquantised layout); an FP8 config without ``weight_block_size`` (per-tensor scales) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, QuantScheme
from weightbridge.layout.quant import quantize_model, select_weights
from weightbridge.spec.errors import show

FP8 = "float8_e4m3fn"


def scheme_of(qc: Any, key: str) -> QuantScheme | None:
    """The block-FP8 scheme a ``quantization_config`` describes; None for another method."""
    if not isinstance(qc, Mapping):
        raise CanonicalSourceError(key, f"quantization_config must be a mapping, got {show(qc)}")
    if qc.get("quant_method") != "fp8":
        return None
    if qc.get("fmt", "e4m3") not in ("e4m3", FP8):
        raise CanonicalSourceError(key, f"FP8 format {show(qc.get('fmt'))} is not supported", "e4m3 checkpoints only")
    block = qc.get("weight_block_size")
    if block is None:
        raise CanonicalSourceError(key, "an FP8 checkpoint without weight_block_size (per-tensor scales) is not "
                                   "supported", "block-scaled FP8 checkpoints (weight_block_size: [128, 128])")
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 1 << 16 for b in block)):
        raise CanonicalSourceError(key, f"weight_block_size must be two positive integers, got {show(block)}")
    scales = "ue8m0" if qc.get("scale_fmt") == "ue8m0" else "float32"
    return QuantScheme(block=(block[0], block[1]), scales=scales)


def _ignored(weight: str, modules: list[str]) -> bool:
    module = f".{weight.rpartition('.')[0]}."
    return any(f".{m}." in module for m in modules)


def apply_quantization_config(model: CanonicalModel, qc: Any, key: str = "config") -> CanonicalModel:
    """``model`` (unquantised, from a config) as the FP8 checkpoint ``qc`` describes (module docstring)."""
    scheme = scheme_of(qc, key)
    if scheme is None:
        return model
    ignored = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
    if not isinstance(ignored, list) or not all(isinstance(m, str) for m in ignored):
        raise CanonicalSourceError(key, f"modules_to_not_convert must be a list of module names, got {show(ignored)}")
    names = [w for w in select_weights(model) if not _ignored(w, ignored)]
    try:
        return quantize_model(model, names, scheme)
    except ValueError as exc:
        raise CanonicalSourceError(key, str(exc)) from None


def from_fp8_header(model: CanonicalModel, config: Mapping[str, Any] | None, dtype: str | None,
                    key: str = "safetensors") -> CanonicalModel:
    """``model`` read from FP8 checkpoint headers, in weightbridge's coordinates (module docstring):
    the FP8 weights back at ``dtype`` (default: the config's, else bfloat16), ``quant`` recorded."""
    fp8 = [t for t in model.tensors if t.dtype == FP8]
    if not fp8:
        return model
    qc = (config or {}).get("quantization_config")
    scheme = scheme_of(qc, key) if qc is not None else None
    if scheme is None:  # no config saying how: the tensors as the headers list them, as before
        return model
    names = [t.name for t in fp8 if t.name + scheme.suffix in model]
    lone = [t.name for t in fp8 if t.name not in names]
    if lone:
        raise CanonicalSourceError(key, f"float8_e4m3fn tensor {show(lone[0])} has no {scheme.suffix} scale tensor")
    target = dtype or "bfloat16"
    scales = {n + scheme.suffix for n in names}
    plain = CanonicalModel(
        tensors=tuple(CanonicalTensor(t.name, t.shape, target) if t.dtype == FP8 else t
                      for t in model.tensors if t.name not in scales),
        params=model.params, source=model.source)
    try:
        out = quantize_model(plain, names, scheme)
    except ValueError as exc:
        raise CanonicalSourceError(key, str(exc)) from None
    for q in out.quant:
        have, want = model[q.scale], out[q.scale]
        if tuple(have.shape) != tuple(want.shape):
            raise CanonicalSourceError(key, f"{q.scale} is {list(have.shape)}, the {scheme.block} blocks of "
                                       f"{list(q.shape)} need {list(want.shape)}")
    return out
