"""Canonical models: the HF checkpoint tensors (name, full shape, dtype) of a model.

The canonical frame is what ``save_pretrained`` writes: per-expert checkpoint
names, full (unsharded) shapes, stored dtypes, tied duplicates absent. A spec's
``model:`` mapping names where that list comes from; :func:`load_canonical`
turns it into a :class:`~weightbridge.layout.ir.CanonicalModel`.

Importing this package is light: torch and transformers are imported only when
a config has to be instantiated (and its result is not cached yet); a bundled
config at its own dtype needs neither under a transformers version its tensor
list ships for (bundled_tensors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from weightbridge.canonical.bundled import bundled_config_path, bundled_names
from weightbridge.canonical.configfile import FLOAT_DTYPES, check_float_dtype, config_dtype, read_config
from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.spec.errors import show
from weightbridge.canonical.hf_config import from_hf_config
from weightbridge.canonical.inline import from_inline
from weightbridge.canonical.params import merge_params, params_from_config
from weightbridge.canonical.safetensors_header import from_safetensors
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor

__all__ = [
    "SOURCE_KEYS",
    "CanonicalSourceError",
    "bundled_config_path",
    "bundled_names",
    "from_hf_config",
    "from_inline",
    "from_safetensors",
    "load_canonical",
]

SOURCE_KEYS: tuple[str, ...] = ("bundled", "config", "safetensors", "tensors")
OPTION_KEYS: tuple[str, ...] = ("dtype", "params")


def load_canonical(
    source: Mapping[str, Any], base_dir: str | Path = ".", *, cache_dir: str | Path | None = None
) -> CanonicalModel:
    """The canonical model a spec's ``model:`` mapping describes.

    ``source`` holds exactly one of ``bundled: NAME``, ``config: PATH`` (a HF
    config.json or a directory holding one), ``safetensors: PATH`` (file, index or
    directory; headers only) or ``tensors: [{name, shape, dtype}, ...]``, plus
    optional ``dtype`` (new dtype for the floating tensors that have the model's
    default dtype; tensors forced to another dtype, e.g. fp32 router biases, keep
    theirs) and optional ``params`` (merged over the derived params). Relative
    paths are relative to ``base_dir``. ``cache_dir`` is passed to
    :func:`from_hf_config`.

    Raises :class:`CanonicalSourceError` naming the faulty key.
    """
    if not isinstance(source, Mapping):
        raise CanonicalSourceError("model", f"expected a mapping, got {type(source).__name__}")
    unknown = sorted(str(k) for k in source if k not in SOURCE_KEYS + OPTION_KEYS)
    if unknown:
        raise CanonicalSourceError(
            "model", f"unknown key(s): {', '.join(unknown)}", f"allowed: {', '.join(SOURCE_KEYS + OPTION_KEYS)}"
        )
    given = [k for k in SOURCE_KEYS if k in source]
    if len(given) != 1:
        found = f"got {', '.join(given)}" if given else "got none"
        raise CanonicalSourceError("model", f"needs exactly one of {', '.join(SOURCE_KEYS)} ({found})")
    kind = given[0]
    dtype = check_float_dtype(source["dtype"]) if source.get("dtype") is not None else None
    user_params = source.get("params")
    if user_params is not None and (
        not isinstance(user_params, Mapping) or not all(isinstance(k, str) for k in user_params)
    ):
        raise CanonicalSourceError("params", "expected a mapping of param name -> value")
    model = _load(kind, source[kind], Path(base_dir), dtype, cache_dir)
    if user_params:
        merged = dict(model.params)
        merged.update(user_params)
        model = replace(model, params=tuple(sorted(merged.items())))
    return model


def _load(kind: str, value: Any, base_dir: Path, dtype: str | None, cache_dir: str | Path | None) -> CanonicalModel:
    if kind == "tensors":
        model = from_inline(value)
        return _override_dtype(model, dtype, _dominant_float_dtype(model)) if dtype else model
    if not isinstance(value, (str, Path)) or not str(value):
        raise CanonicalSourceError(kind, f"expected a {'name' if kind == 'bundled' else 'path'}, got {show(value)}")
    if kind == "bundled":
        path = bundled_config_path(str(value))
        try:
            shipped = _shipped(str(value), path, dtype)
            if shipped is not None:
                return shipped
            model = from_hf_config(path, dtype, cache_dir=cache_dir)
        except CanonicalSourceError as exc:
            raise CanonicalSourceError("bundled", f"{value}: {exc.message}", exc.hint) from exc
        return replace(model, source=f"bundled:{value}")
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if kind == "config":
        return from_hf_config(path, dtype, cache_dir=cache_dir)
    model = from_safetensors(path)
    if not dtype:
        return model
    beside = (path if path.is_dir() else path.parent) / "config.json"
    default = config_dtype(read_config(beside, "safetensors")[0]) if beside.is_file() else None
    return _override_dtype(model, dtype, default or _dominant_float_dtype(model))


def _shipped(name: str, path: Path, dtype: str | None) -> CanonicalModel | None:
    """Bundled model ``name`` from its shipped list (:mod:`weightbridge.canonical.bundled_tensors`: no
    transformers import, no cache) when one was computed under the installed transformers version
    for the dtype asked; else None."""
    from weightbridge.canonical.bundled_tensors import shipped_tensors  # here: `python -m` of that module imports this

    raw, _ = read_config(path, "bundled")
    found = shipped_tensors(name, dtype or config_dtype(raw) or "float32")
    if found is None:
        return None
    tensors, name_params = found
    return CanonicalModel(tensors=tensors, params=merge_params(name_params, params_from_config(raw)),
                          source=f"bundled:{name}")


def _dominant_float_dtype(model: CanonicalModel) -> str | None:
    """The floating dtype holding the most elements (the model's default dtype when no config says)."""
    numel: dict[str, int] = {}
    for t in model.tensors:
        if t.dtype in FLOAT_DTYPES:
            n = 1
            for d in t.shape:
                n *= d
            numel[t.dtype] = numel.get(t.dtype, 0) + n
    return max(sorted(numel), key=lambda d: numel[d]) if numel else None


def _override_dtype(model: CanonicalModel, dtype: str, default: str | None) -> CanonicalModel:
    """Tensors of dtype ``default`` become ``dtype``; all others (and scale tensors) keep theirs."""
    if default is None or default == dtype:
        return model
    scales = {q.scale for q in model.quant}
    tensors = tuple(CanonicalTensor(t.name, t.shape, dtype) if t.dtype == default and t.name not in scales else t
                    for t in model.tensors)
    return replace(model, tensors=tensors)
