"""Name templates: ``model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight``.

Variables: ``{layer}`` / ``{expert}`` (global indices, bound by matching canonical
names), ``{local_layer}`` / ``{local_expert}`` (index within the rank's pipeline
stage / expert-parallel slice; local names only), and ``{*}`` (the whole
canonical name; a fallback rule). Matching is by *skeleton*: every maximal run of
digits becomes ``#``, so one dictionary lookup finds every candidate name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

GLOBAL_VARS = ("layer", "expert")
WHOLE = "*"
_VAR = re.compile(r"\{([a-z_*]+)\}")
_DIGIT_RUNS = re.compile(r"(\d+)")


class TemplateError(ValueError):
    """A template that uses an unknown variable or cannot be matched."""


def skeleton(name: str) -> tuple[str, tuple[int, ...]]:
    """``model.layers.12.mlp`` -> (``model.layers.#.mlp``, (12,))."""
    parts = _DIGIT_RUNS.split(name)  # text, digits, text, ..., text: one regex pass
    return "#".join(parts[0::2]), tuple(map(int, parts[1::2]))


def variables(template: str) -> tuple[str, ...]:
    return tuple(_VAR.findall(template))


@dataclass(frozen=True)
class CanonicalPattern:
    """A compiled canonical-name template: its skeleton and what each digit run means."""

    template: str
    skeleton: str
    slots: tuple[str | int, ...]  # per digit run: a variable name, or the literal value it must equal
    whole: bool = False

    @classmethod
    def compile(cls, template: str) -> CanonicalPattern:
        names = variables(template)
        if WHOLE in names:
            if template != "{*}":
                raise TemplateError(f"{{*}} must be the whole template, got {template!r}")
            return cls(template, "", (), whole=True)
        bad = [v for v in names if v not in GLOBAL_VARS]
        if bad:
            raise TemplateError(
                f"unknown variable {{{bad[0]}}} in canonical template {template!r} (use {{layer}} or {{expert}})"
            )
        pieces = _VAR.split(template)  # literal, var, literal, var, ...
        skel: list[str] = []
        slots: list[str | int] = []  # one per digit run, left to right
        for i, piece in enumerate(pieces):
            if i % 2:
                skel.append("#")
                slots.append(piece)
                continue
            if (i > 0 and piece[:1].isdigit()) or (i + 1 < len(pieces) and piece[-1:].isdigit()):
                raise TemplateError(f"a variable touches digits in {template!r}")
            piece_skeleton, digits = skeleton(piece)
            skel.append(piece_skeleton)
            slots.extend(digits)
        return cls(template, "".join(skel), tuple(slots))

    def bind(self, numbers: tuple[int, ...]) -> dict[str, int] | None:
        """Variable values if a name with these digit runs matches, else None."""
        if len(numbers) != len(self.slots):
            return None
        out: dict[str, int] = {}
        for slot, value in zip(self.slots, numbers):
            if isinstance(slot, int):
                if slot != value:
                    return None
            elif out.setdefault(slot, value) != value:
                return None
        return out


class NameIndex:
    """Canonical names grouped by skeleton, for fast template matching."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names: set[str] = set()
        self._by_skeleton: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
        for name in names:
            self._names.add(name)
            skel, nums = skeleton(name)
            self._by_skeleton[skel].append((name, nums))

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def match(self, pattern: CanonicalPattern) -> list[tuple[str, dict[str, int]]]:
        """Every canonical name the pattern matches, with its variable bindings (index order)."""
        if pattern.whole:
            return [(n, {}) for n in sorted(self._names)]
        out = []
        for name, nums in self._by_skeleton.get(pattern.skeleton, ()):
            bound = pattern.bind(nums)
            if bound is not None:
                out.append((name, bound))
        return out


def fill(template: str, values: dict[str, object]) -> str:
    """Substitute variables; ``{*}`` takes ``values['*']``."""
    return Filler.of(template)(values)


class Filler:
    """A template split once into literals and variables, filled by joining (expansion fills tens of
    thousands of names per side: a regex substitution each was a third of rule compilation)."""

    _cache: dict[str, Filler] = {}

    def __init__(self, template: str) -> None:
        self.template = template
        pieces = _VAR.split(template)  # literal, variable, literal, variable, ..., literal
        # As a str.format string (literal braces doubled): str.format_map does the join in C.
        self._format = "".join(p.replace("{", "{{").replace("}", "}}") if i % 2 == 0 else "{" + p + "}"
                               for i, p in enumerate(pieces))

    @classmethod
    def of(cls, template: str) -> Filler:
        hit = cls._cache.get(template)
        if hit is None:
            if len(cls._cache) > 4096:  # templates come from presets and specs: a few hundred at most
                cls._cache.clear()
            hit = cls._cache[template] = cls(template)
        return hit

    def __call__(self, values: dict[str, object]) -> str:
        try:
            return self._format.format_map(values)
        except KeyError as exc:
            raise TemplateError(f"variable {{{exc.args[0]}}} in {self.template!r} has no value here") from None
