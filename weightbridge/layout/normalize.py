"""Normal form of layouts, so that equal layouts compare (and hash) equal. Pure: no torch.

Spec expansion, probing and DTensor introspection may split one region of a local tensor
into different boxes (whole blocks vs rows vs tiles). :func:`normalize_pieces` merges
adjacent pieces that form one box and sorts them; :func:`layout_fingerprint` hashes the
normalised tensors of a rank (names, shapes, dtypes, pieces; not the rank's numbering), which
is what a spec pins (``pins:``) and what ``weightbridge probe`` / ``diff`` print.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from weightbridge.layout.box import box_shape, corresponding_sub
from weightbridge.layout.ir import LocalTensor, Piece, RankLayout, tensor_to_json


def _canon(p: Piece) -> Piece:
    if p.transpose and sum(1 for a, b in p.canonical_box if b - a > 1) < 2:
        return p._replace(transpose=False)
    return p


def _merge_pair(p: Piece, q: Piece) -> Piece | None:
    """``p`` and ``q`` as one piece when they are adjacent halves of one, else None."""
    if p.canonical != q.canonical or p.transpose != q.transpose or len(p.local_box) != len(q.local_box):
        return None
    ld = [d for d, (x, y) in enumerate(zip(p.local_box, q.local_box)) if x != y]
    cd = [d for d, (x, y) in enumerate(zip(p.canonical_box, q.canonical_box)) if x != y]
    if len(ld) != 1 or len(cd) != 1:
        return None
    d, i = ld[0], cd[0]
    if p.local_box[d][1] == q.local_box[d][0] and p.canonical_box[i][1] == q.canonical_box[i][0]:
        a, b = p, q
    elif q.local_box[d][1] == p.local_box[d][0] and q.canonical_box[i][1] == p.canonical_box[i][0]:
        a, b = q, p
    else:
        return None
    lb = list(a.local_box)
    lb[d] = (a.local_box[d][0], b.local_box[d][1])
    cb = list(a.canonical_box)
    cb[i] = (a.canonical_box[i][0], b.canonical_box[i][1])
    m = _canon(Piece(a.canonical, tuple(cb), tuple(lb), a.transpose))
    if not m.transpose:
        shp_c = [n for n in box_shape(m.canonical_box) if n != 1]
    else:
        shp_c = [n for n in box_shape(m.canonical_box) if n != 1][::-1]
    if shp_c != [n for n in box_shape(m.local_box) if n != 1]:
        return None
    for part in (a, b):
        pairs = corresponding_sub(part.canonical_box, m.canonical_box, m.local_box, m.transpose)
        if len(pairs) != 1 or pairs[0][1] != part.local_box:
            return None
    return m


def normalize_pieces(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    """Merge adjacent pieces that form one box; sort by local box. Equal layouts built from
    different box splits (rows vs whole blocks, tiles) come out equal."""
    groups: dict[tuple[str, bool], list[Piece]] = {}
    for p in pieces:
        p = _canon(p)
        groups.setdefault((p.canonical, p.transpose), []).append(p)
    out: list[Piece] = []
    for group in groups.values():
        group.sort(key=lambda p: p.local_box)
        changed = True
        while changed and len(group) > 1:
            changed = False
            for x in range(len(group)):
                for y in range(x + 1, len(group)):
                    m = _merge_pair(group[x], group[y])
                    if m is not None:
                        group[x] = m
                        del group[y]
                        changed = True
                        break
                if changed:
                    break
        out.extend(group)
    out.sort(key=lambda p: (p.local_box, p.canonical, p.canonical_box))
    return tuple(out)


def normalize_tensor(t: LocalTensor) -> LocalTensor:
    return t._replace(pieces=normalize_pieces(t.pieces))


def normalize_layout(layout: RankLayout) -> RankLayout:
    """Same layout, pieces normalised, tensors sorted by name."""
    tensors = tuple(sorted((normalize_tensor(t) for t in layout.tensors), key=lambda t: t.name))
    return RankLayout(layout.side, layout.rank, tensors, layout.instance, layout.local_rank, layout.coords)


def layout_fingerprint(layout: RankLayout) -> str:
    """sha256 (16 hex chars) of a rank's normalised local tensors that hold canonical elements.

    Tensors holding nothing (an all-padding shard) are left out, as ``diff`` treats them as
    absent; side, rank and coordinates are left out, so a probe and a spec expansion of the
    same rank fingerprint equal exactly when ``weightbridge diff`` finds them identical
    (up to box splits that greedy merging does not bring together).
    """
    h = hashlib.sha256()
    for t in normalize_layout(layout).tensors:
        if t.pieces:
            h.update(json.dumps(tensor_to_json(t), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()[:16]
