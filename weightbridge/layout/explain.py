"""Which local tensors of a rank ``weightbridge explain`` (and the MCP ``explain_tensor`` tool) shows.

The JSON form is :meth:`RankLayout.to_json` of the selected tensors:
``{"side", "rank", "instance", "local_rank", "coords", "tensors": [{"name", "shape", "dtype",
"pieces": [{"canonical", "canonical_box", "local_box", "transpose"}]}]}``, plus ``"casts"``
when values of the selected tensors pass through the checkpoint's narrower dtype
(``SideLayout.casts``): ``[{"tensor", "canonical", "checkpoint_dtype", "dtype"}]``.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase
from collections.abc import Mapping
from typing import Any

from weightbridge.layout.ir import LocalTensor, RankLayout, checkpoint_cast


def tensor_matches(t: LocalTensor, pattern: str | None) -> bool:
    """True when ``pattern`` (a glob; None matches all) matches the local name or a canonical source name."""
    if pattern is None:
        return True
    return fnmatchcase(t.name, pattern) or any(fnmatchcase(p.canonical, pattern) for p in t.pieces)


def select_tensors(rank: RankLayout, pattern: str | None) -> list[LocalTensor]:
    """The local tensors of ``rank`` that ``pattern`` matches, in the rank's order."""
    return [t for t in rank.tensors if tensor_matches(t, pattern)]


def tensor_casts(tensors: list[LocalTensor], casts: Mapping[str, str]) -> list[dict[str, str]]:
    """The checkpoint casts (``SideLayout.casts``) the values of ``tensors`` go through, one per
    (local tensor, canonical tensor): the wire carries ``checkpoint_dtype``, the tensor is ``dtype``."""
    out = []
    for t in tensors:
        for name in sorted({p.canonical for p in t.pieces}):
            via = casts.get(name)
            if via is not None and checkpoint_cast(t.dtype, via):
                out.append({"tensor": t.name, "canonical": name, "checkpoint_dtype": via, "dtype": t.dtype})
    return out


def explain_json(rank: RankLayout, tensors: list[LocalTensor], casts: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``explain --json`` object of ``rank`` restricted to ``tensors``."""
    out = replace(rank, tensors=tuple(tensors)).to_json()
    found = tensor_casts(tensors, casts or {})
    if found:
        out["casts"] = found
    return out
