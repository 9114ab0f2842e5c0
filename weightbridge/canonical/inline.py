"""Canonical model from tensors listed inline (a spec's ``model.tensors``).

Frame: in — a list of ``{name, shape, dtype}`` mappings (canonical frame: full
shapes, HF checkpoint names); out — those tensors in natural name order, with
params inferred from names (``layers.N``, ``experts.E``, ``embed_tokens``) and
overridden by the ``params`` given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.spec.errors import show
from weightbridge.canonical.naming import sort_tensors
from weightbridge.canonical.params import merge_params, params_from_names
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, normalize_dtype

_KEY = "tensors"


def from_inline(tensors: Sequence[Mapping[str, Any]], params: Mapping[str, Any] | None = None) -> CanonicalModel:
    """Canonical model of inline tensor dicts; raises CanonicalSourceError (key ``tensors``) on bad entries."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise CanonicalSourceError(_KEY, "must be a list of {name, shape, dtype} mappings")
    if not tensors:
        raise CanonicalSourceError(_KEY, "is empty")
    out: dict[str, CanonicalTensor] = {}
    for i, item in enumerate(tensors):
        t = _tensor(i, item)
        if t.name in out:
            raise CanonicalSourceError(_KEY, f"[{i}]: duplicate tensor name {show(t.name)}")
        out[t.name] = t
    ordered = sort_tensors(out.values())
    return CanonicalModel(tensors=ordered, params=merge_params(params_from_names(ordered), params), source="inline")


def _tensor(i: int, item: Any) -> CanonicalTensor:
    if not isinstance(item, Mapping):
        raise CanonicalSourceError(_KEY, f"[{i}]: expected a mapping with name, shape, dtype, got {show(item)}")
    unknown = sorted(set(item) - {"name", "shape", "dtype"})
    if unknown:
        raise CanonicalSourceError(
            _KEY, f"[{i}]: unknown key(s) {', '.join(map(str, unknown))}", "use name, shape, dtype"
        )
    name, shape, raw_dtype = item.get("name"), item.get("shape"), item.get("dtype")
    if not isinstance(name, str) or not name:
        raise CanonicalSourceError(_KEY, f"[{i}].name: expected a non-empty string, got {show(name)}")
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CanonicalSourceError(_KEY, f"[{i}].shape: expected a list of non-negative integers, got {show(shape)}")
    dtype = normalize_dtype(raw_dtype) if isinstance(raw_dtype, str) else None
    if dtype is None:
        raise CanonicalSourceError(_KEY, f"[{i}].dtype: unknown dtype {show(raw_dtype)}", "e.g. bfloat16, float32")
    return CanonicalTensor(name, tuple(shape), dtype)
