"""What layout expansion derives from a canonical model alone, computed once per model object.

The name index (:class:`~weightbridge.layout.templates.NameIndex`), the model's layers, and the
names each canonical template binds (:meth:`ModelFacts.matches`) are the same for both sides of a
spec and for every expansion of the same model: computing them once saved ~0.5 s of DeepSeek-V3's
spec resolution. Pure (no torch).
"""

from __future__ import annotations

import re
import weakref

from weightbridge.layout.ir import CanonicalModel
from weightbridge.layout.templates import CanonicalPattern, Filler, NameIndex

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a canonical name's layer (the first ``layers.N.``)


class ModelFacts:
    """What expansion derives from the canonical model alone (the name index, its layers), shared
    by both sides and by every expansion of the same model object: 0.3 s for DeepSeek-V3 each."""

    def __init__(self, model: CanonicalModel) -> None:
        self.index = NameIndex(t.name for t in model.tensors)
        found = {int(m.group(1)) for t in model.tensors if (m := LAYER.search(t.name))}
        self.layers: list[int | None] = [None, *sorted(found)]
        self.num_layers = max(found) + 1 if found else 0
        self._matches: dict[tuple, list[tuple[dict[str, int], list[str]]]] = {}

    def matches(self, first: CanonicalPattern, parts: tuple[str, ...], requires: tuple[str, ...],
                unless: tuple[str, ...]) -> list[tuple[dict[str, int], list[str]]]:
        """``(values, names per part)`` of every canonical name ``first`` matches whose parts all
        exist, ``requires`` all exist and ``unless`` none does (index order). Shared by both sides:
        a trainer's fused gate/up and a rollout's stacked experts bind the same names. Read-only."""
        key = (parts, requires, unless)
        hit = self._matches.get(key)
        if hit is None:
            index, hit = self.index, []
            fillers = [Filler.of(t) for t in parts]
            need = [Filler.of(t) for t in requires]
            refuse = [Filler.of(t) for t in unless]
            for _name, values in index.match(first):
                names = [f(values) for f in fillers]
                if any(n not in index for n in names):
                    continue
                if need and any(f(values) not in index for f in need):
                    continue
                if refuse and any(f(values) in index for f in refuse):
                    continue
                hit.append((values, names))
            self._matches[key] = hit
        return hit


_FACTS: dict[int, tuple[weakref.ref, ModelFacts]] = {}


def model_facts(model: CanonicalModel) -> ModelFacts:
    """The model's :class:`ModelFacts`, computed once per live model object (keyed by identity:
    hashing a frozen model would hash every tensor; the entry goes when the model does)."""
    key = id(model)
    hit = _FACTS.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    facts = ModelFacts(model)
    _FACTS[key] = (weakref.ref(model, lambda _ref, key=key: _FACTS.pop(key, None)), facts)
    return facts
