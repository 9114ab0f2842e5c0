"""Planner geometry on top of :mod:`weightbridge.layout.box`: piece mapping, wire items, subtraction, row splits.

All boxes are tuples of half-open ``(start, stop)`` pairs. The frame of every box
is named in each docstring. Pure Python, no torch.
"""

from __future__ import annotations

from weightbridge.layout.box import Box, box_numel, box_shape, corresponding_sub, intersect
from weightbridge.layout.ir import LocalTensor, Piece
from weightbridge.plan.types import WireItem

# (canonical box shape, local box shape) -> local dim index for each canonical dim, or None
# when the two shapes are not the same after dropping unit dims.
_SQUEEZE_CACHE: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...] | None] = {}


def _squeeze_map(cshape: tuple[int, ...], lshape: tuple[int, ...]) -> tuple[int, ...] | None:
    key = (cshape, lshape)
    hit = _SQUEEZE_CACHE.get(key, key)
    if hit is not key:
        return hit  # type: ignore[return-value]
    cdims = [d for d, n in enumerate(cshape) if n != 1]
    ldims = [d for d, n in enumerate(lshape) if n != 1]
    out: tuple[int, ...] | None = None
    if [cshape[d] for d in cdims] == [lshape[d] for d in ldims]:
        m = [-1] * len(cshape)
        for c, l in zip(cdims, ldims):
            m[c] = l
        out = tuple(m)
    _SQUEEZE_CACHE[key] = out
    return out


# (canonical box, local box) -> per canonical dim (local dim or -1, offset local - canonical),
# or None when the piece needs the general row-major mapping.
_FAST_CACHE: dict[tuple[Box, Box], tuple[tuple[int, int], ...] | None] = {}


def _fast(pc: Box, lb: Box) -> tuple[tuple[int, int], ...] | None:
    key = (pc, lb)
    hit = _FAST_CACHE.get(key, key)
    if hit is not key:
        return hit  # type: ignore[return-value]
    out: tuple[tuple[int, int], ...] | None = None
    if len(pc) == len(lb) and all(b - a == d - c for (a, b), (c, d) in zip(pc, lb)):
        out = tuple((d, lb[d][0] - pc[d][0]) for d in range(len(pc)))
    else:
        m = _squeeze_map(box_shape(pc), box_shape(lb))
        if m is not None:
            out = tuple((d, (lb[d][0] - pc[c][0]) if d >= 0 else 0) for c, d in enumerate(m))
    if len(_FAST_CACHE) > 1 << 16:
        _FAST_CACHE.clear()
    _FAST_CACHE[key] = out
    return out


def map_to_local(sub: Box, piece: Piece) -> list[tuple[Box, Box]]:
    """Map ``sub`` (canonical frame, inside ``piece.canonical_box``) into the piece's local tensor.

    Returns ``[(canonical_part, local_box), ...]`` whose canonical parts cover ``sub``;
    one pair whenever ``sub`` is a single box in the local frame (the usual case).
    ``local_box`` is in the local tensor's frame and holds ``canonical_part`` in the
    piece's row-major correspondence (dims reversed when ``piece.transpose``).
    """
    pc, lb = piece.canonical_box, piece.local_box
    if sub == pc:
        return [(sub, lb)]
    if not piece.transpose:
        f = _fast(pc, lb)
        if f is not None:
            out = list(lb)
            for (a, b), (d, off) in zip(sub, f):
                if d >= 0:
                    out[d] = (a + off, b + off)
            return [(sub, tuple(out))]
    return corresponding_sub(sub, pc, lb, piece.transpose)


def subtract(a: Box, b: Box) -> list[Box]:
    """``a`` minus ``b`` as disjoint boxes (same frame), in a fixed order; ``[a]`` when disjoint."""
    if intersect(a, b) is None:
        return [a]
    out: list[Box] = []
    rest = list(a)
    for d, ((a0, a1), (b0, b1)) in enumerate(zip(a, b)):
        if a0 < b0:
            out.append(tuple(rest[:d]) + ((a0, b0),) + tuple(rest[d + 1 :]))
        if b1 < a1:
            out.append(tuple(rest[:d]) + ((b1, a1),) + tuple(rest[d + 1 :]))
        rest[d] = (max(a0, b0), min(a1, b1))
    return out


def subtract_all(a: Box, others: list[Box]) -> list[Box]:
    """``a`` minus the union of ``others``, as disjoint boxes."""
    parts = [a]
    for b in others:
        nxt: list[Box] = []
        for p in parts:
            nxt.extend(subtract(p, b))
        parts = nxt
        if not parts:
            break
    return parts


def row_axis(box: Box) -> int:
    """The outermost dim of ``box`` with extent > 1 (0 when there is none): the axis rows are cut along."""
    for d, (a, b) in enumerate(box):
        if b - a > 1:
            return d
    return 0


def num_rows(box: Box) -> int:
    if not box:
        return 1
    a, b = box[row_axis(box)]
    return b - a


def rows(box: Box, lo: int, hi: int) -> Box:
    """Rows ``[lo, hi)`` (relative, along :func:`row_axis`) of ``box``, same frame."""
    if not box:
        return box
    d = row_axis(box)
    a = box[d][0]
    return box[:d] + ((a + lo, a + hi),) + box[d + 1 :]


def split_box(box: Box, max_numel: int) -> list[Box]:
    """Cut ``box`` into boxes of at most ``max_numel`` elements (>= 1), in row-major order.

    Cuts along :func:`row_axis` into near-equal slabs of whole rows; a single row larger
    than ``max_numel`` is cut the same way along the next dims.
    """
    n = box_numel(box)
    if n <= max_numel or n <= 1:
        return [box]
    d = row_axis(box)
    a, b = box[d]
    ext = b - a
    row = n // ext
    if row <= max_numel:
        per = max(1, max_numel // row)
        parts = -(-ext // per)
        base, extra = divmod(ext, parts)
        out, pos = [], a
        for i in range(parts):
            w = base + (1 if i < extra else 0)
            out.append(box[:d] + ((pos, pos + w),) + box[d + 1 :])
            pos += w
        return out
    out = []
    for i in range(a, b):
        head = box[:d] + ((i, i + 1),)
        for sub in split_box(box[d + 1 :], max_numel):
            out.append(head + sub)
    return out


def make_items(
    name: str, box: Box, st: LocalTensor, sp: Piece, dt: LocalTensor, dp: Piece, dtype: str, esize: int
) -> list[WireItem]:
    """Items moving ``box`` (canonical frame) from piece ``sp`` of ``st`` to piece ``dp`` of ``dt``.

    One item unless ``box`` is not a single box in one of the local frames; then it is cut
    into parts that are boxes in both.
    """
    if box == sp.canonical_box and box == dp.canonical_box:
        return [WireItem(name, box, st.name, sp.local_box, sp.transpose, dt.name, dp.local_box, dp.transpose, dtype,
                         box_numel(box) * esize)]
    out: list[WireItem] = []

    def emit(c: Box) -> None:
        s = map_to_local(c, sp)
        if len(s) > 1:
            for cc, _ in s:
                emit(cc)
            return
        d = map_to_local(c, dp)
        if len(d) > 1:
            for cc, _ in d:
                emit(cc)
            return
        out.append(WireItem(name, c, st.name, s[0][1], sp.transpose, dt.name, d[0][1], dp.transpose, dtype,
                            box_numel(c) * esize))

    emit(box)
    return out
