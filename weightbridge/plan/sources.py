"""Step 1 of the planner: trainer layout -> atoms (disjoint canonical boxes) and their holders.

Per canonical tensor, trainer pieces with the same canonical box form a replication class; a
rank appears once per class. Classes that are pairwise disjoint are the *atoms*; partially
overlapping classes are refined on every class edge, and each cell's holders are all classes
containing it. Input: :class:`SideLayout` (trainer). Output: :data:`AtomIndex`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from weightbridge.layout.box import Box, intersect
from weightbridge.layout.ir import LocalTensor, Piece, SideLayout

Holder = tuple[int, LocalTensor, Piece]  # (trainer rank, local tensor, the piece holding the atom)


class Atom(NamedTuple):
    """A canonical box held identically by ``holders`` (trainer ranks, ascending)."""

    canonical: str
    box: Box  # frame: canonical tensor
    holders: tuple[Holder, ...]


AtomIndex = dict[str, list[Atom]]  # canonical name -> its atoms, sorted by box


def index_sources(trainer: SideLayout) -> AtomIndex:
    """Per canonical tensor, disjoint atoms with their holders (one piece per holder rank)."""
    first: dict[str, tuple[Box, int, LocalTensor, Piece]] = {}  # the one piece of most tensors
    more: dict[str, list[tuple[Box, int, LocalTensor, Piece]]] = {}
    for lay in trainer.ranks:
        rank = lay.rank
        for t in lay.tensors:
            for p in t.pieces:  # empty pieces become atoms no need ever intersects
                name = p.canonical
                if name in first:
                    lst = more.get(name)
                    if lst is None:
                        more[name] = [first[name], (p.canonical_box, rank, t, p)]
                    else:
                        lst.append((p.canonical_box, rank, t, p))
                else:
                    first[name] = (p.canonical_box, rank, t, p)
    out: AtomIndex = {}
    for name, (box, rank, t, p) in first.items():
        lst = more.get(name)
        if lst is None:
            out[name] = [Atom(name, box, ((rank, t, p),))]
            continue
        by_box: dict[Box, dict[int, tuple[LocalTensor, Piece]]] = {}
        for box, rank, t, p in lst:
            by_box.setdefault(box, {}).setdefault(rank, (t, p))
        boxes = sorted(by_box)
        if len(boxes) == 1 or _pairwise_disjoint(boxes):
            out[name] = [Atom(name, b, _holders(by_box[b])) for b in boxes]
        else:
            out[name] = _refine(name, boxes, by_box)
    return out


def _holders(d: dict[int, tuple[LocalTensor, Piece]]) -> tuple[Holder, ...]:
    if len(d) == 1:
        for r, (t, p) in d.items():
            return ((r, t, p),)
    return tuple((r, t, p) for r, (t, p) in sorted(d.items(), key=lambda kv: kv[0]))


def _pairwise_disjoint(boxes: Sequence[Box]) -> bool:
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if intersect(boxes[i], boxes[j]) is not None:
                return False
    return True


def _refine(name: str, boxes: list[Box], by_box: dict) -> list[Atom]:
    """Partially overlapping replica classes: cut on every class edge, holders = classes containing the cell."""
    ndim = len(boxes[0])
    cuts = [sorted({x for b in boxes for x in b[d]}) for d in range(ndim)]
    cells: list[Box] = [()]
    for d in range(ndim):
        cells = [c + ((lo, hi),) for c in cells for lo, hi in zip(cuts[d], cuts[d][1:])]
    atoms = []
    for cell in cells:
        merged: dict[int, tuple[LocalTensor, Piece]] = {}
        for b in boxes:
            if all(a0 <= c0 and c1 <= a1 for (a0, a1), (c0, c1) in zip(b, cell)):
                for r, tp in by_box[b].items():
                    merged.setdefault(r, tp)
        if merged:
            atoms.append(Atom(name, cell, _holders(merged)))
    return atoms


__all__ = ["Atom", "AtomIndex", "Holder", "index_sources"]
