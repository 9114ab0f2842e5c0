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
_DIGITS = re.compile(r"\d+")


class TemplateError(ValueError):
    """A template that uses an unknown variable or cannot be matched."""


def skeleton(name: str) -> tuple[str, tuple[int, ...]]:
    """``model.layers.12.mlp`` -> (``model.layers.#.mlp``, (12,))."""
    return _DIGITS.sub("#", name), tuple(int(m) for m in _DIGITS.findall(name))


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
            skel.append(_DIGITS.sub("#", piece))
            slots.extend(int(d) for d in _DIGITS.findall(piece))
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

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise TemplateError(f"variable {{{key}}} in {template!r} has no value here")
        return str(values[key])

    return _VAR.sub(sub, template)
