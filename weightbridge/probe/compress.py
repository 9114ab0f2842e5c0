"""Element maps <-> pieces: compress where each local element came from into boxes, and
normalise piece lists so that equal layouts compare equal.

An *element map* of a local tensor is an int64 array of its shape holding, per element,
the global canonical id minus one (``g >= 0``), or a negative marker (unmapped / invalid).
Global ids number every canonical element: tensors in model order, row-major within.

:func:`compress` grows boxes greedily in row-major order: from the first unassigned
element it finds, per local dim, which canonical dim a step of +1 moves along (a
transposed weight moves along reversed dims), then extends the innermost dim as far as
the ids follow, then the next outer dim slab by slab, and so on. Every element of a
box is checked, so the pieces are exact; a loader that permutes elements arbitrarily
just yields many small pieces (capped by ``max_pieces``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from weightbridge.layout.box import box_shape
from weightbridge.layout.ir import CanonicalModel, Piece
from weightbridge.layout.normalize import normalize_pieces  # noqa: F401 - re-exported

ASSIGNED = -3


@dataclass(frozen=True)
class IdSpace:
    """Global element ids of a canonical model (``gid - 1`` = offset + flat index)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    starts: np.ndarray  # int64, first global index (0-based) of each tensor

    @classmethod
    def of(cls, model: CanonicalModel) -> IdSpace:
        names = tuple(t.name for t in model.tensors)
        shapes = tuple(tuple(t.shape) for t in model.tensors)
        sizes = [prod(s) for s in shapes]
        starts = np.zeros(len(sizes), dtype=np.int64)
        if sizes:
            starts[1:] = np.cumsum(sizes[:-1])
        return cls(names, shapes, starts)

    @property
    def total(self) -> int:
        return int(self.starts[-1] + prod(self.shapes[-1])) if self.names else 0

    def index(self, name: str) -> int:
        return self.names.index(name)

    def locate(self, g: int) -> tuple[int, tuple[int, ...]]:
        """Tensor index and coordinates of global index ``g`` (0-based)."""
        i = int(np.searchsorted(self.starts, g, side="right")) - 1
        flat = g - int(self.starts[i])
        return i, tuple(int(c) for c in np.unravel_index(flat, self.shapes[i])) if self.shapes[i] else ()


def _strides(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def compress(gmap: np.ndarray, ids: IdSpace, *, row_offset: int = 0, max_pieces: int = 1_000_000) -> list[Piece]:
    """Pieces of one local tensor (or a tile of its rows starting at ``row_offset``) from its element map.

    ``gmap`` is modified (assigned elements are overwritten).
    """
    L = gmap.shape
    nd = gmap.ndim
    flat = gmap.reshape(-1)
    pieces: list[Piece] = []
    ptr = 0
    n = flat.size
    while True:
        ptr = _next_unassigned(flat, ptr)
        if ptr >= n:
            break
        g0 = int(flat[ptr])
        l0 = tuple(int(c) for c in np.unravel_index(ptr, L)) if nd else ()
        ti, c0 = ids.locate(g0)
        cshape = ids.shapes[ti]
        cstr = _strides(cshape)
        # which canonical dim a +1 step along each local dim moves along
        mapping: dict[int, int] = {}
        for j in range(nd):
            if l0[j] + 1 >= L[j]:
                continue
            nb = list(l0)
            nb[j] += 1
            s = int(gmap[tuple(nb)]) - g0
            for i, st in enumerate(cstr):
                if st == s and cshape[i] > 1 and c0[i] + 1 < cshape[i]:
                    if i not in mapping.values():
                        mapping[j] = i
                    break
        # keep a monotone association (increasing = plain, decreasing = transposed)
        js = sorted(mapping)
        while len(js) >= 2:
            seq = [mapping[j] for j in js]
            inc = all(a < b for a, b in zip(seq, seq[1:]))
            dec = all(a > b for a, b in zip(seq, seq[1:]))
            if inc or dec:
                break
            js = js[1:]
        mapping = {j: mapping[j] for j in js}
        ext = [1] * nd
        for j in reversed(range(nd)):
            if j not in mapping:
                continue
            i = mapping[j]
            limit = min(L[j] - l0[j], cshape[i] - c0[i])
            ext[j] = _grow(gmap, l0, ext, j, mapping, cstr, g0, limit)
        shift = [row_offset] + [0] * (nd - 1)
        local_box = tuple((l0[j] + shift[j], l0[j] + ext[j] + shift[j]) for j in range(nd))
        cext = [1] * len(cshape)
        for j, i in mapping.items():
            cext[i] = ext[j]
        canon_box = tuple((c0[i], c0[i] + cext[i]) for i in range(len(cshape)))
        nonunit = [j for j in mapping if ext[j] > 1]
        transpose = len(nonunit) >= 2 and mapping[nonunit[0]] > mapping[nonunit[1]]
        pieces.append(Piece(ids.names[ti], canon_box, local_box, transpose))
        gmap[tuple(slice(l0[j], l0[j] + ext[j]) for j in range(nd))] = ASSIGNED
        if len(pieces) > max_pieces:
            raise ValueError(f"more than {max_pieces} pieces: the loader scatters elements (not a box layout)")
    return pieces


def _next_unassigned(flat: np.ndarray, ptr: int) -> int:
    """First index >= ptr holding an id (windows growing from 4096: linear in what is skipped)."""
    n = flat.size
    w = 4096
    while ptr < n:
        hits = np.flatnonzero(flat[ptr : ptr + w] >= 0)
        if hits.size:
            return ptr + int(hits[0])
        ptr += w
        w = min(w * 2, 1 << 22)
    return n


def _grow(gmap: np.ndarray, l0, ext, j, mapping, cstr, g0, limit) -> int:
    """Largest extent along local dim ``j`` (<= limit) whose slabs all hold the expected ids."""
    nd = gmap.ndim
    got = 1
    step = 1
    while got < limit:
        hi = min(limit, got + step)
        sl = []
        expected = np.int64(g0)
        for k in range(nd):
            if k < j:
                sl.append(slice(l0[k], l0[k] + 1))
                continue
            a, b = (got, hi) if k == j else (0, ext[k])
            sl.append(slice(l0[k] + a, l0[k] + b))
            if k in mapping:
                shape = [1] * nd
                shape[k] = b - a
                expected = expected + (np.arange(a, b, dtype=np.int64) * cstr[mapping[k]]).reshape(shape)
        region = gmap[tuple(sl)]
        ok = region == expected
        axes = tuple(k for k in range(nd) if k != j)
        ok_slab = ok.all(axis=axes) if axes else ok
        bad = np.flatnonzero(~ok_slab)
        if bad.size:
            return got + int(bad[0])
        got = hi
        step *= 2
    return got


# ---------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------


def element_map(
    pieces: Iterable[Piece], shape: Sequence[int], bases: dict[str, tuple[int, tuple[int, ...]]]
) -> np.ndarray:
    """The element map (``-1`` = no piece) of a local tensor, ids from ``bases[name] = (offset, shape)``."""
    out = np.full(tuple(shape), -1, dtype=np.int64)
    for p in pieces:
        off, cshape = bases[p.canonical]
        grids = np.meshgrid(*[np.arange(a, b) for a, b in p.canonical_box], indexing="ij")
        flat = np.ravel_multi_index(grids, cshape) + off if grids else np.array(off)
        if p.transpose:
            flat = np.transpose(flat)
        out[tuple(slice(a, b) for a, b in p.local_box)] = flat.reshape(box_shape(p.local_box))
    return out
