"""Step 2 of the planner: what every rollout template slot needs, cut into chunks by atom.

Per template slot (:mod:`weightbridge.plan.instances`), the canonical boxes it needs, each
element once (:func:`receiver_needs`: when one rank holds an element in two local tensors, e.g.
tied embeddings, it crosses the wire once and a :class:`LocalCopy` fills the second place).
Each need is intersected with the atoms of its tensor (:mod:`weightbridge.plan.sources`; a dict
lookup by name, then a loop over that tensor's few atoms: no pair scans over ranks).

Input: :data:`Templates` and :data:`AtomIndex`. Output: :class:`Cover`.
"""

from __future__ import annotations

from typing import NamedTuple

from weightbridge.layout.box import Box, box_numel, intersect, is_empty
from weightbridge.layout.ir import DTYPE_BYTES, LocalTensor, Piece, RankLayout, dtype_bytes
from weightbridge.plan.geometry import make_items, subtract_all
from weightbridge.plan.instances import Templates
from weightbridge.plan.sources import Atom, AtomIndex
from weightbridge.plan.types import LocalCopy


class Need(NamedTuple):
    canonical: str
    box: Box  # canonical frame; disjoint from every other need of the same slot
    tensor: LocalTensor
    piece: Piece


# A LocalCopy's fields without the rank: (canonical, canonical_box, src_tensor, src_box,
# src_transpose, dst_tensor, dst_box, dst_transpose).
SlotCopy = tuple


class Chunk(NamedTuple):
    """The part ``box`` of one atom that template ``template``'s slot ``slot`` needs in ``piece`` of ``tensor``."""

    template: int  # index into the templates
    slot: int  # local rank within the template's instances
    box: Box  # canonical frame: atom box & need box
    tensor: LocalTensor  # the receiver's local tensor
    piece: Piece  # the receiver's piece holding ``box``


class AtomChunks(NamedTuple):
    """One atom and every chunk of it that some template slot needs."""

    atom: Atom
    chunks: tuple[Chunk, ...]


class Cover(NamedTuple):
    """What the rollout needs, by atom, in canonical order."""

    chunks: tuple[AtomChunks, ...]  # atoms in canonical (name, box) order
    copies: tuple[LocalCopy, ...]  # receiver-local duplicates of every instance, sorted
    min_wire_bytes: int  # sum over rollout ranks of the bytes each needs


def cover_needs(templates: Templates, sources: AtomIndex) -> Cover:
    """Every template slot's needs intersected with the atoms that hold them."""
    copies: list[LocalCopy] = []
    min_wire = 0
    by_name: dict[str, list[tuple[int, int, Need]]] = {}
    for g, tpl in enumerate(templates):
        ninst = len(tpl.ranks)
        for l, lay in enumerate(tpl.layouts):
            nbytes = 0
            names = [p.canonical for t in lay.tensors for p in t.pieces]
            if len(set(names)) == len(names):  # usual case: each canonical tensor once on this rank
                for t in lay.tensors:
                    es = DTYPE_BYTES[t.dtype]
                    for p in t.pieces:
                        box = p.canonical_box
                        n = 1
                        for a, z in box:
                            n *= z - a
                        if n <= 0:
                            continue
                        nbytes += n * es
                        need = Need(p.canonical, box, t, p)
                        lst = by_name.get(p.canonical)
                        if lst is None:
                            by_name[p.canonical] = [(g, l, need)]
                        else:
                            lst.append((g, l, need))
            else:
                needs, slot_copies = receiver_needs(lay)
                for inst_ranks in tpl.ranks:
                    copies.extend(LocalCopy(inst_ranks[l], *c) for c in slot_copies)
                for n in needs:
                    nbytes += box_numel(n.box) * dtype_bytes(n.tensor.dtype)
                    by_name.setdefault(n.canonical, []).append((g, l, n))
            min_wire += ninst * nbytes
    chunks: list[AtomChunks] = []
    new = tuple.__new__  # Chunk(...) without the Python-level namedtuple __new__
    for name in sorted(by_name):
        atoms = sources.get(name)
        if not atoms:
            continue
        lst = by_name[name]
        if len(atoms) == 1:
            ab = atoms[0].box
            out = []
            for g, l, n in lst:
                c = n.box if n.box == ab else intersect(n.box, ab)
                if c is not None:
                    out.append(new(Chunk, (g, l, c, n.tensor, n.piece)))
            if out:
                chunks.append(AtomChunks(atoms[0], tuple(out)))
            continue
        for atom in atoms:
            out = []
            for g, l, n in lst:
                c = intersect(n.box, atom.box)
                if c is not None:
                    out.append(new(Chunk, (g, l, c, n.tensor, n.piece)))
            if out:
                chunks.append(AtomChunks(atom, tuple(out)))
    return Cover(tuple(chunks), tuple(sorted(copies)), min_wire)


def receiver_needs(lay: RankLayout) -> tuple[list[Need], list[SlotCopy]]:
    """Canonical boxes one rollout rank needs, each element once, plus its local copies.

    Local copies are returned rank-less (:data:`SlotCopy`): the slot's every instance makes them.
    """
    by_name: dict[str, list[tuple[LocalTensor, Piece]]] = {}
    for t in lay.tensors:
        for p in t.pieces:
            if not is_empty(p.canonical_box):
                by_name.setdefault(p.canonical, []).append((t, p))
    needs: list[Need] = []
    copies: list[SlotCopy] = []
    for name in sorted(by_name):
        tps = by_name[name]
        if len(tps) == 1:
            t, p = tps[0]
            needs.append(Need(name, p.canonical_box, t, p))
            continue
        seen: list[tuple[Box, LocalTensor, Piece]] = []
        for t, p in tps:
            box = p.canonical_box
            for part in subtract_all(box, [b for b, _, _ in seen]):
                needs.append(Need(name, part, t, p))
            for b, t0, p0 in seen:
                ov = intersect(box, b)
                if ov is None:
                    continue
                for part in subtract_all(ov, [x for x, _, _ in seen[: seen.index((b, t0, p0))]]):
                    for it in make_items(name, part, t0, p0, t, p, t.dtype, 0):
                        copies.append((name, it.canonical_box, it.src_tensor, it.src_box, it.src_transpose,
                                       it.dst_tensor, it.dst_box, it.dst_transpose))
            seen.append((box, t, p))
    return needs, copies


__all__ = ["AtomChunks", "Chunk", "Cover", "Need", "SlotCopy", "cover_needs", "receiver_needs"]
