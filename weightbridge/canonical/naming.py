"""Names of canonical tensors: natural ordering and digit-free patterns.

Frame: canonical (HF checkpoint) tensor names such as
``model.layers.3.mlp.experts.17.gate_proj.weight``.

Order decision: canonical tensors are sorted by :func:`natural_key`, i.e. runs of
decimal digits compare as integers (``layers.2`` < ``layers.10``) and everything
else compares as text. The order is total and deterministic (no two distinct
names share a key), identical across processes and transformers versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from weightbridge.layout.ir import CanonicalTensor

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, str | int], ...]:
    """Sort key of ``name``: alternating text and integer runs (``a.10.b`` -> text, 10, text).

    Each part is tagged ``(0, text)`` or ``(1, int)`` so parts never compare across
    types; ``"007"`` and ``"7"`` are told apart by a final raw-text tie-break.
    """
    parts = _DIGITS.split(name)
    return split_key(parts[0::2], [int(p) for p in parts[1::2]], name)


def split_key(texts: list[str], numbers: Iterable[int], name: str) -> tuple[tuple[int, str | int], ...]:
    """:func:`natural_key` of ``name`` = texts[0] + numbers[0] + texts[1] + ..., given in its parts
    (what a caller that built the name from them has without a regex pass)."""
    key: list[tuple[int, str | int]] = [(0, texts[0])]
    for n, text in zip(numbers, texts[1:]):
        key += [(1, n), (0, text)]
    key.append((0, name))
    return tuple(key)


def sort_tensors(tensors: Iterable[CanonicalTensor]) -> tuple[CanonicalTensor, ...]:
    """Canonical tensors in natural name order."""
    return tuple(sorted(tensors, key=lambda t: natural_key(t.name)))


def name_pattern(name: str) -> str:
    """``name`` with every all-digit dot component replaced by ``*``.

    ``model.layers.3.mlp.experts.17.gate_proj.weight`` ->
    ``model.layers.*.mlp.experts.*.gate_proj.weight``.
    """
    return ".".join("*" if part.isdigit() else part for part in name.split("."))
