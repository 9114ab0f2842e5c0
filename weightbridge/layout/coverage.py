"""Coverage and tiling checks on layout IR (pure).

* :func:`uncovered` — canonical tensors (or parts) that no rank of a group holds.
* :func:`tiling_problems` — pieces of one local tensor out of bounds or overlapping.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import product

from weightbridge.layout.box import Box, box_numel, box_shape, format_box, in_bounds, intersect
from weightbridge.layout.ir import CanonicalModel, LocalTensor, RankLayout


def union_numel(boxes: Iterable[Box]) -> int:
    """Number of elements in the union of boxes (same frame), by coordinate compression.

    Each box marks the grid cells it spans, so the cost is the cells the boxes cover (one each for
    shards that partition a tensor), not cells x boxes: a tensor split over TP 32 has 32 boxes."""
    uniq = list(dict.fromkeys(boxes))
    if not uniq:
        return 0
    if len(uniq) == 1:
        return box_numel(uniq[0])
    ndim = len(uniq[0])
    for d in range(ndim):  # shards of one dim (TP): equal elsewhere, disjoint along d -> a plain sum
        if len({b[:d] + b[d + 1:] for b in uniq}) == 1:
            spans = sorted(b[d] for b in uniq)
            if all(a[1] <= b[0] for a, b in zip(spans, spans[1:])):
                return sum(box_numel(b) for b in uniq)
            break
    cuts = [sorted({x for b in uniq for x in b[d]}) for d in range(ndim)]
    at = [{x: i for i, x in enumerate(c)} for c in cuts]
    covered: set[tuple[int, ...]] = set()
    for box in uniq:
        covered.update(product(*(range(at[d][lo], at[d][hi]) for d, (lo, hi) in enumerate(box))))
    total = 0
    for cell in covered:
        n = 1
        for d, i in enumerate(cell):
            n *= cuts[d][i + 1] - cuts[d][i]
        total += n
    return total


def uncovered(model: CanonicalModel, ranks: Iterable[RankLayout]) -> dict[str, int]:
    """Canonical name -> number of its elements held by none of ``ranks`` (only names with a gap)."""
    boxes: dict[str, set[Box]] = defaultdict(set)
    seen: set[int] = set()
    for r in ranks:
        if id(r.tensors) in seen:  # identical replicas share their tensor tuple
            continue
        seen.add(id(r.tensors))
        for t in r.tensors:
            for p in t.pieces:
                boxes[p.canonical].add(p.canonical_box)
    out = {}
    for t in model.tensors:
        numel = 1
        for d in t.shape:
            numel *= d
        got = boxes.get(t.name)
        have = union_numel(got) if got else 0
        if have < numel:
            out[t.name] = numel - have
    return out


def tiling_problems(t: LocalTensor, model: CanonicalModel | None = None) -> list[str]:
    """Pieces of ``t`` that lie outside it (or outside their canonical tensor), mismatch in size, or overlap."""
    out = []
    for p in t.pieces:
        if not in_bounds(p.local_box, t.shape):
            out.append(f"{t.name}: local box {format_box(p.local_box)} outside shape {list(t.shape)}")
        if model is not None:
            if p.canonical not in model:
                out.append(f"{t.name}: unknown canonical tensor {p.canonical}")
            elif not in_bounds(p.canonical_box, model[p.canonical].shape):
                out.append(f"{t.name}: {p.canonical}{format_box(p.canonical_box)} outside {list(model[p.canonical].shape)}")
        if box_numel(p.local_box) != box_numel(p.canonical_box):
            out.append(f"{t.name}: piece sizes differ: {box_shape(p.local_box)} vs {box_shape(p.canonical_box)}")
    ordered = sorted(t.pieces, key=lambda p: p.local_box)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.local_box and a.local_box and b.local_box[0][0] >= a.local_box[0][1]:
                break
            if len(a.local_box) == len(b.local_box) and intersect(a.local_box, b.local_box) is not None:
                out.append(f"{t.name}: pieces overlap at {format_box(intersect(a.local_box, b.local_box))}")
    return out
