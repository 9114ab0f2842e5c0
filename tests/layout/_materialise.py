"""Test helpers: build layouts from presets and materialise them with distinct values.

Every canonical tensor is filled with distinct int64 ids (one global id space, so a
local element tells which canonical tensor *and* which element it came from). A
local tensor is built by copying its pieces exactly as the IR says
(``local[local_box] = canonical[canonical_box]`` in row-major correspondence, the
canonical box read with its dims reversed when ``piece.transpose``); local elements
no piece writes stay ``-1``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from math import prod
from typing import Any

import numpy as np

from weightbridge.layout.box import Box, box_numel, box_shape, format_box, in_bounds
from weightbridge.layout.expand import ExpandProblem, SideConfig, expand_side
from weightbridge.layout.ir import CanonicalModel, LocalTensor, RankLayout, SideLayout
from weightbridge.spec.models import SideSpec
from weightbridge.spec.sides import side_config

UNWRITTEN = -1
TINY_MODELS = ("tiny-qwen2", "tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3")


def slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


@cache
def tiny_model(name: str) -> CanonicalModel:
    """A bundled tiny canonical model (built once per process)."""
    from weightbridge.canonical import load_canonical

    return load_canonical({"bundled": name}, ".")


@dataclass(frozen=True)
class CanonicalIds:
    """Distinct int64 ids for every element of every canonical tensor."""

    model: CanonicalModel
    offsets: Mapping[str, int]
    arrays: Mapping[str, np.ndarray]
    total: int

    @classmethod
    def of(cls, model: CanonicalModel) -> CanonicalIds:
        offsets, arrays, off = {}, {}, 0
        for t in model.tensors:
            n = prod(t.shape)
            offsets[t.name] = off
            arrays[t.name] = np.arange(off, off + n, dtype=np.int64).reshape(t.shape)
            off += n
        return cls(model, offsets, arrays, off)

    def owner(self, ids: np.ndarray) -> list[str]:
        """Canonical tensor names owning the given ids."""
        names = list(self.offsets)
        starts = np.array([self.offsets[n] for n in names])
        return [names[i] for i in np.searchsorted(starts, ids, side="right") - 1]


def materialise(t: LocalTensor, canon: CanonicalIds) -> np.ndarray:
    """Build local tensor ``t`` from its pieces; asserts each piece fits and no local element is written twice."""
    local = np.full(t.shape, UNWRITTEN, dtype=np.int64)
    for p in t.pieces:
        assert p.canonical in canon.arrays, f"{t.name}: unknown canonical {p.canonical}"
        cshape = canon.arrays[p.canonical].shape
        assert in_bounds(p.local_box, t.shape), f"{t.name}: local box {format_box(p.local_box)} outside {t.shape}"
        assert in_bounds(p.canonical_box, cshape), (
            f"{t.name}: {p.canonical}{format_box(p.canonical_box)} outside {cshape}"
        )
        assert box_numel(p.local_box) == box_numel(p.canonical_box), f"{t.name}: piece sizes differ: {p}"
        src = canon.arrays[p.canonical][slices(p.canonical_box)]
        if p.transpose:
            src = np.transpose(src)  # dims reversed
        dst = local[slices(p.local_box)]
        assert (dst == UNWRITTEN).all(), f"{t.name}: local elements of {format_box(p.local_box)} written twice"
        local[slices(p.local_box)] = src.reshape(box_shape(p.local_box))
    return local


def materialise_rank(rank: RankLayout, canon: CanonicalIds) -> dict[str, np.ndarray]:
    names = [t.name for t in rank.tensors]
    assert len(names) == len(set(names)), f"rank {rank.rank}: duplicate local names"
    return {t.name: materialise(t, canon) for t in rank.tensors}


def unique_layouts(ranks: Iterable[RankLayout]) -> list[tuple[RankLayout, int]]:
    """Ranks with identical tensor tuples merged: (representative, multiplicity)."""
    out: dict[int, list] = {}
    for r in ranks:
        key = id(r.tensors)  # expansion shares one tuple between identical ranks; hashing it is slow
        if key in out:
            out[key][1] += 1
        else:
            out[key] = [r, 1]
    return [(r, n) for r, n in out.values()]


def coverage_counts(ranks: Iterable[RankLayout], canon: CanonicalIds, cache_: dict | None = None) -> np.ndarray:
    """How many local elements (over ``ranks``) hold each canonical element.

    ``cache_`` maps ``id(rank.tensors)`` to materialised tensors (filled as needed).
    """
    counts = np.zeros(canon.total, dtype=np.int64)
    cache_ = {} if cache_ is None else cache_
    for r, mult in unique_layouts(ranks):
        key = id(r.tensors)
        if key not in cache_:
            cache_[key] = materialise_rank(r, canon)
        vals = [arr[arr != UNWRITTEN] for arr in cache_[key].values()]
        vals = np.concatenate(vals) if vals else np.zeros(0, dtype=np.int64)
        if vals.size:
            counts += np.bincount(vals, minlength=canon.total) * mult
    return counts


def build(
    side: str, preset: str, mesh: Mapping[str, int], model: CanonicalModel, instances: int = 1, **spec: Any
) -> tuple[SideConfig, SideLayout, list[ExpandProblem]]:
    """Expand a preset on ``model`` exactly as a spec would (``side_config`` + ``expand_side``)."""
    cfg = side_config(side, SideSpec(preset=preset, mesh=dict(mesh), instances=instances, **spec))
    layout, problems = expand_side(cfg, model)
    return cfg, layout, problems


def padded_local_patterns(cfg: SideConfig) -> list[re.Pattern[str]]:
    """Local-name patterns of the rules that pad a part (only they may hold unwritten elements)."""
    out = []
    for rule, _ in cfg.rules:
        if any(p.pad is not None for p in rule.parts()):
            rx = re.sub(r"\\\{[a-z_*]+\\\}", r"[^.]+", re.escape(rule.local))
            out.append(re.compile(rx + r"\Z"))
    return out
