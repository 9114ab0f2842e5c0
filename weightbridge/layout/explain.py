"""Which local tensors of a rank ``weightbridge explain`` (and the MCP ``explain_tensor`` tool) shows.

The JSON form is :meth:`RankLayout.to_json` of the selected tensors:
``{"side", "rank", "instance", "local_rank", "coords", "tensors": [{"name", "shape", "dtype",
"pieces": [{"canonical", "canonical_box", "local_box", "transpose"}]}]}``.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any

from weightbridge.layout.ir import LocalTensor, RankLayout


def tensor_matches(t: LocalTensor, pattern: str | None) -> bool:
    """True when ``pattern`` (a glob; None matches all) matches the local name or a canonical source name."""
    if pattern is None:
        return True
    return fnmatchcase(t.name, pattern) or any(fnmatchcase(p.canonical, pattern) for p in t.pieces)


def select_tensors(rank: RankLayout, pattern: str | None) -> list[LocalTensor]:
    """The local tensors of ``rank`` that ``pattern`` matches, in the rank's order."""
    return [t for t in rank.tensors if tensor_matches(t, pattern)]


def explain_json(rank: RankLayout, tensors: list[LocalTensor]) -> dict[str, Any]:
    """The ``explain --json`` object of ``rank`` restricted to ``tensors``."""
    return replace(rank, tensors=tuple(tensors)).to_json()
