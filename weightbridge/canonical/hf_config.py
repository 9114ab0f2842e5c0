"""Canonical model of a HF config: instantiate on the meta device, list checkpoint tensors.

Frame: in — a raw HF ``config.json`` (path, directory holding one, or dict);
out — canonical tensors, i.e. exactly the (name, full shape, dtype) entries that
``save_pretrained`` of that architecture writes: per-expert checkpoint names
(``...mlp.experts.17.gate_proj.weight``), not transformers-v5 fused runtime
parameters (``...mlp.experts.gate_up_proj``); tied duplicates (``lm_head.weight``
under ``tie_word_embeddings``) dropped; persistent buffers kept with their own
dtype (DeepSeek-V3's ``e_score_correction_bias`` stays float32 on a bf16 model).

The pipeline mirrors ``PreTrainedModel.save_pretrained``: ``state_dict()`` ->
drop ``_keys_to_ignore_on_save`` -> ``remove_tied_weights_from_state_dict`` ->
``revert_weight_conversion``, all on meta tensors (no weights, no hub).

A block-FP8 ``quantization_config`` (``quant_method: fp8``, ``weight_block_size``) makes the
model pre-quantised (:mod:`weightbridge.canonical.quantized`: the quantised weights keep the
config's dtype, their scale tensors are added, ``CanonicalModel.quant`` says how they are stored);
any other ``quantization_config`` is ignored: the canonical model is the unquantized layout.

Results are cached as JSON under :func:`default_cache_dir`, keyed by the sha256
of the prepared config, the dtype and the transformers version; torch and
transformers are imported only on a cache miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from weightbridge.canonical.configfile import check_float_dtype, config_dtype, read_config
from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.canonical.naming import sort_tensors
from weightbridge.canonical.params import merge_params, params_from_config, params_from_names
from weightbridge.canonical.quantized import apply_quantization_config
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, normalize_dtype
from weightbridge.spec.errors import show

CACHE_FORMAT = 3  # 3: forced-fp32 modules applied explicitly (dotted names too)
_DROPPED_KEYS = ("quantization_config",)


def default_cache_dir() -> Path:
    """``$WEIGHTBRIDGE_CACHE_DIR/canonical``, else ``$XDG_CACHE_HOME`` or ``~/.cache`` + ``weightbridge/canonical``."""
    root = os.environ.get("WEIGHTBRIDGE_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "canonical"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "weightbridge" / "canonical"


def from_hf_config(
    config: str | Path | dict[str, Any],
    dtype: str | None = None,
    *,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
) -> CanonicalModel:
    """Canonical model of a HF architecture config.

    ``config``: a ``config.json`` path, a directory holding one, or the parsed dict.
    ``dtype``: dtype of the model's floating parameters (default: the config's
    ``dtype``/``torch_dtype``, else float32); tensors transformers forces to fp32
    stay fp32. ``cache_dir``: where cached results live (default
    :func:`default_cache_dir`); ``use_cache=False`` neither reads nor writes it.

    Raises :class:`CanonicalSourceError` (key ``config``/``dtype``) on unreadable
    configs, unknown model types or architectures transformers cannot build.
    """
    if isinstance(config, dict):
        raw, source = config, "config:<dict>"
    else:
        raw, path = read_config(config, "config")
        source = f"config:{path}"
    prepared = _prepare(raw)
    missing = missing_sizes(raw)
    if missing:
        _check_model_type(prepared, _transformers_version())  # an unknown model_type is the first thing to say
        model_type = prepared.get("model_type")
        raise CanonicalSourceError(
            "config",
            f"{source.removeprefix('config:')} gives no {', '.join(missing)}: transformers would fill "
            f"{'it' if len(missing) == 1 else 'them'} in from its {model_type!r} defaults, a model of another size",
            "use the model's full config.json (as save_pretrained writes it), or model.bundled: NAME "
            "(weightbridge models lists them)",
        )
    target = check_float_dtype(dtype) if dtype is not None else (config_dtype(prepared) or "float32")
    tensors = _tensors(prepared, target, Path(cache_dir) if cache_dir else default_cache_dir(), use_cache)
    params = merge_params(params_from_names(tensors), params_from_config(raw))
    model = CanonicalModel(tensors=tensors, params=params, source=source)
    if "quantization_config" in raw:
        model = apply_quantization_config(model, raw["quantization_config"])
    return model


# Sizes a config must give itself (under any alias params.py knows, or in text_config): without
# them transformers silently builds its default model of that type (a 12B model for {"model_type": "qwen2"}).
REQUIRED_SIZES: tuple[tuple[str, str], ...] = (
    ("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"),
)


def missing_sizes(raw: dict[str, Any]) -> list[str]:
    """HF names of the required sizes ``raw`` does not give (empty: it gives them all)."""
    given = params_from_config(raw)
    return [hf_name for key, hf_name in REQUIRED_SIZES if key not in given]


def _check_model_type(prepared: dict[str, Any], version: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = prepared.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise CanonicalSourceError(
            "config", f"model_type {show(model_type)} is unknown to transformers {version}", "check config.json"
        )


# Instantiating on the meta device costs time per module: a hostile num_hidden_layers of 10**9 would
# never finish. Far above any real model (DeepSeek-V3: 61 layers, 256 experts).
MAX_LAYERS, MAX_EXPERTS = 4096, 65536


def _check_size_bounds(prepared: dict[str, Any]) -> None:
    params = params_from_config(prepared)
    for key, limit in (("num_layers", MAX_LAYERS), ("num_experts", MAX_EXPERTS)):
        value = params.get(key)
        if isinstance(value, int) and not 0 <= value <= limit:
            raise CanonicalSourceError(
                "config", f"{key} {show(value)} is out of range (0..{limit})", "check config.json"
            )


def _prepare(raw: dict[str, Any]) -> dict[str, Any]:
    """Config dict as handed to transformers: quantization dropped, ``torch_dtype`` -> ``dtype``."""
    cfg = {k: v for k, v in raw.items() if k not in _DROPPED_KEYS}
    if "torch_dtype" in cfg:
        legacy = cfg.pop("torch_dtype")
        cfg.setdefault("dtype", legacy)
    return cfg


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError as exc:
        raise CanonicalSourceError("config", "transformers is not installed", "pip install transformers") from exc


def cache_key(prepared: dict[str, Any], dtype: str, transformers_version: str) -> str:
    """sha256 (hex) naming the cache entry of one (config, dtype, transformers version)."""
    blob = json.dumps(
        {"format": CACHE_FORMAT, "config": prepared, "dtype": dtype, "transformers": transformers_version},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _tensors(prepared: dict[str, Any], dtype: str, cache_dir: Path, use_cache: bool) -> tuple[CanonicalTensor, ...]:
    version = _transformers_version()
    entry = cache_dir / f"{cache_key(prepared, dtype, version)}.json"
    if use_cache:
        cached = _read_cache(entry)
        if cached is not None:
            return cached
    tensors = sort_tensors(_instantiate(prepared, dtype, version))
    if use_cache:
        _write_cache(entry, tensors, dtype, version)
    return tensors


def _read_cache(entry: Path) -> tuple[CanonicalTensor, ...] | None:
    """Cached tensors, or None when absent or unreadable (then recomputed and rewritten)."""
    try:
        obj = json.loads(entry.read_text(encoding="utf-8"))
        if obj.get("format") != CACHE_FORMAT:
            return None
        return tuple(CanonicalTensor(str(n), tuple(int(d) for d in s), str(dt)) for n, s, dt in obj["tensors"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(entry: Path, tensors: tuple[CanonicalTensor, ...], dtype: str, version: str) -> None:
    """Write atomically (temp file + rename in the same directory); failures are ignored."""
    obj = {
        "format": CACHE_FORMAT,
        "transformers": version,
        "dtype": dtype,
        "tensors": [[t.name, list(t.shape), t.dtype] for t in tensors],
    }
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(obj, fh, separators=(",", ":"))
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass


def _instantiate(prepared: dict[str, Any], dtype: str, version: str) -> list[CanonicalTensor]:
    """Build the architecture on the meta device and list what save_pretrained would write."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from weightbridge.tensors import torch_dtype

    _check_model_type(prepared, version)
    _check_size_bounds(prepared)
    model_type = prepared["model_type"]
    try:
        config_obj = CONFIG_MAPPING[model_type].from_dict(prepared)
        dtype_kw = "dtype" if int(version.split(".")[0]) >= 5 else "torch_dtype"
        with torch.device("meta"):
            model = _model_class(transformers, prepared)(config_obj, **{dtype_kw: torch_dtype(dtype)})
        state = model.state_dict()
        for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
            state.pop(key, None)
        state = _drop_tied(model, state)
        state = _revert(model, state)
        forced = _forced_fp32(model, dtype)
    except CanonicalSourceError:
        raise
    except Exception as exc:  # transformers' code on a user's config: any failure is the config's
        raise CanonicalSourceError(
            "config", f"transformers {version} cannot build {model_type!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return [
        CanonicalTensor(name, tuple(int(d) for d in t.shape),
                        "float32" if t.dtype.is_floating_point and forced(name) else _dtype_name(t.dtype))
        for name, t in state.items()
    ]


def _forced_fp32(model: Any, dtype: str) -> Any:
    """Which names transformers keeps in float32 at this dtype: ``_keep_in_fp32_modules_strict``
    (bf16 and fp16), ``_keep_in_fp32_modules`` (fp16 only), matched per name component as
    ``from_pretrained`` does (whole dotted components). Some transformers versions also apply this at construction; others
    only when loading, so it is applied here explicitly and the result does not depend on which."""
    keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == "float16":
        keep += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype not in ("float16", "bfloat16") or not keep:
        return lambda name: False
    # a module name ("e_score_correction_bias") or a dotted path ("gate.weight"), matched on whole components
    return lambda name: any(f".{k}." in f".{name}." for k in keep)


def _model_class(transformers: Any, prepared: dict[str, Any]) -> Any:
    """Constructor: the config's ``architectures[0]`` class if transformers has it, else AutoModelForCausalLM."""
    archs = prepared.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        cls = getattr(transformers, archs[0], None)
        if cls is not None and hasattr(cls, "_from_config"):
            return cls._from_config
    return transformers.AutoModelForCausalLM.from_config


def _drop_tied(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Drop tied aliases the way save_pretrained does (transformers' own tied-keys logic)."""
    try:
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError:  # older transformers: keep the first name of each shared parameter
        keep = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        return {k: v for k, v in state.items() if k in keep}
    return remove_tied_weights_from_state_dict(state, model)


def _revert(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Runtime names/fusions -> checkpoint names (transformers >= 5; identity before)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    return revert_weight_conversion(model, state)


def _dtype_name(dtype: Any) -> str:
    from weightbridge.tensors import dtype_name

    raw = dtype_name(dtype)
    return normalize_dtype(raw) or raw
