"""Boxes: per-dimension half-open intervals, and the geometry on them.

A *box* is a tuple of ``(start, stop)`` pairs, one per tensor dimension, in the
frame of one tensor (canonical or local; the caller names the frame). Boxes are
plain tuples so that millions of them stay cheap, hashable and JSON-friendly
(``[[start, stop], ...]``).

Element correspondence between two boxes of equal numel is **row-major**: the
k-th element of one box in row-major order is the k-th element of the other.
That single rule covers equal shapes, squeezed unit dims (an expert slot
``[e:e+1, 0:I, 0:H]`` vs ``[0:I, 0:H]``) and different factorisations of the same
elements (a ``[24]`` view vs a ``[4, 6]`` view).

Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

Interval = tuple[int, int]
Box = tuple[Interval, ...]
Shape = tuple[int, ...]


def full_box(shape: Sequence[int]) -> Box:
    """The box covering a whole tensor of ``shape``."""
    return tuple((0, int(n)) for n in shape)


def box_shape(box: Box) -> Shape:
    return tuple(b - a for a, b in box)


def box_numel(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def is_empty(box: Box) -> bool:
    return any(b <= a for a, b in box)


def in_bounds(box: Box, shape: Sequence[int]) -> bool:
    """True when ``box`` has one interval per dim of ``shape`` and lies inside it."""
    return len(box) == len(shape) and all(0 <= a <= b <= n for (a, b), n in zip(box, shape))


def intersect(x: Box, y: Box) -> Box | None:
    """Intersection of two boxes in the same frame, or None when empty."""
    out = []
    for (a0, b0), (a1, b1) in zip(x, y, strict=True):
        a, b = max(a0, a1), min(b0, b1)
        if b <= a:
            return None
        out.append((a, b))
    return tuple(out)


def contains(outer: Box, inner: Box) -> bool:
    """True when ``inner`` lies inside ``outer`` (same frame)."""
    return all(a0 <= a1 and b1 <= b0 for (a0, b0), (a1, b1) in zip(outer, inner, strict=True))


def relative(inner: Box, outer: Box) -> Box:
    """``inner`` expressed in the frame of ``outer``'s origin (``inner`` inside ``outer``)."""
    return tuple((a - o, b - o) for (a, b), (o, _) in zip(inner, outer, strict=True))


def translate(box: Box, origin: Sequence[int]) -> Box:
    """Shift ``box`` by ``origin`` (inverse of :func:`relative`)."""
    return tuple((a + o, b + o) for (a, b), o in zip(box, origin, strict=True))


def transpose_box(box: Box) -> Box:
    """Reverse the dimension order (matrix transpose for 2-D)."""
    return tuple(reversed(box))


def overlaps(x: Box, y: Box) -> bool:
    return intersect(x, y) is not None


def format_box(box: Box) -> str:
    """Compact form: ``[0:4, 8:16]``."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


# ---------------------------------------------------------------------------
# Different factorisations of the same elements.
# ---------------------------------------------------------------------------


def common_refinement(a: Sequence[int], b: Sequence[int]) -> Shape | None:
    """The coarsest shape both ``a`` and ``b`` are merges of, or None.

    ``[24]`` and ``[4, 6]`` refine to ``[4, 6]``; ``[4, 6]`` and ``[2, 4, 3]`` to
    ``[2, 2, 2, 3]``. None when the prefix products do not form a divisibility
    chain (``[6, 4]`` vs ``[4, 6]``), i.e. the two views do not nest.
    Unit dimensions are dropped; both shapes must have the same, non-zero numel.
    """
    a = [n for n in a if n != 1]
    b = [n for n in b if n != 1]
    if prod(a) != prod(b) or 0 in a or 0 in b:
        return None  # different sizes, or empty: nothing to align
    pa, pb = _prefix_products(a), _prefix_products(b)
    cuts = sorted(set(pa) | set(pb))
    for lo, hi in zip(cuts, cuts[1:]):
        if hi % lo:
            return None
    return tuple(hi // lo for lo, hi in zip([1, *cuts], cuts))


def _prefix_products(shape: Sequence[int]) -> list[int]:
    out, p = [], 1
    for n in shape:
        p *= n
        out.append(p)
    return out


def _groups(shape: Sequence[int], refined: Sequence[int]) -> list[list[int]]:
    """For each dim of ``shape`` (unit dims included), the refined dims it is made of."""
    groups: list[list[int]] = []
    j = 0
    for n in shape:
        if n == 1:
            groups.append([])
            continue
        members, p = [], 1
        while p < n:
            members.append(refined[j])
            p *= refined[j]
            j += 1
        groups.append(members)
    return groups


def _split_interval(a: int, b: int, dims: Sequence[int]) -> list[Interval] | None:
    """Write ``[a, b)`` of a dim of size ``prod(dims)`` as a box over ``dims`` (outer first), or None."""
    out: list[Interval] = []
    for k in range(len(dims)):
        inner = prod(dims[k + 1 :])
        lo, hi = a // inner, (b - 1) // inner + 1
        if hi - lo > 1:
            if a % inner or b % inner:
                return None  # spans several outer rows without being row-aligned
            out.append((lo, hi))
            out.extend((0, m) for m in dims[k + 1 :])
            return out
        out.append((lo, hi))
        a, b = a - lo * inner, b - lo * inner
    return out


def reshape_box(box: Box, src_shape: Sequence[int], dst_shape: Sequence[int]) -> Box | None:
    """The same elements as ``box`` (in ``src_shape``) as one box of ``dst_shape``, or None.

    None means the elements are not a single box in the other view (e.g. a range
    crossing partial rows); use :func:`boxes_of_flat_range` on :func:`flat_runs`
    for the general decomposition.
    """
    refined = common_refinement(src_shape, dst_shape)
    if refined is None:
        return None
    fine: list[Interval] = []
    for (a, b), dims in zip(box, _groups(src_shape, refined), strict=True):
        if not dims:
            continue
        part = _split_interval(a, b, dims)
        if part is None:
            return None
        fine.extend(part)
    out: list[Interval] = []
    j = 0
    for dims in _groups(dst_shape, refined):
        if not dims:
            out.append((0, 1))
            continue
        ivs = fine[j : j + len(dims)]
        j += len(dims)
        # Merge: once an interval is partial, every more-outer one must be a single row.
        lo, hi, inner = 0, 0, 1
        first = True
        for (a, b), n in zip(reversed(ivs), reversed(dims)):
            if first:
                lo, hi, first = a, b, False
            else:
                if b - a > 1 and (lo != 0 or hi != inner):
                    return None
                lo, hi = a * inner + lo, (b - 1) * inner + hi
            inner *= n
        out.append((lo, hi))
    return tuple(out)


def flat_runs(box: Box, shape: Sequence[int]) -> list[Interval]:
    """The box as maximal contiguous ranges of the row-major flattened tensor."""
    if is_empty(box):
        return []
    # Merge trailing dims that the box covers fully into one contiguous run.
    k = len(shape)
    while k > 0 and box[k - 1] == (0, shape[k - 1]):
        k -= 1
    if k == 0:
        return [(0, prod(shape))]
    run_len = (box[k - 1][1] - box[k - 1][0]) * prod(shape[k:])
    stride = [prod(shape[i + 1 :]) for i in range(len(shape))]
    base_first = box[k - 1][0] * stride[k - 1]
    runs: list[Interval] = []

    def walk(d: int, off: int) -> None:
        if d == k - 1:
            start = off + base_first
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], start + run_len)
            else:
                runs.append((start, start + run_len))
            return
        for i in range(box[d][0], box[d][1]):
            walk(d + 1, off + i * stride[d])

    walk(0, 0)
    return runs


def boxes_of_flat_range(start: int, stop: int, shape: Sequence[int]) -> list[Box]:
    """Decompose the flattened range ``[start, stop)`` of ``shape`` into few boxes, in order."""
    if stop <= start:
        return []
    if not shape:
        return [()]
    inner = prod(shape[1:])
    lo, hi = start // inner, (stop - 1) // inner
    if lo == hi:
        return [((lo, lo + 1), *b) for b in boxes_of_flat_range(start - lo * inner, stop - lo * inner, shape[1:])]
    out: list[Box] = []
    first_full = lo if start % inner == 0 else lo + 1
    last_full = hi + 1 if stop % inner == 0 else hi
    if first_full > lo:
        out += [((lo, lo + 1), *b) for b in boxes_of_flat_range(start - lo * inner, inner, shape[1:])]
    if last_full > first_full:
        out.append(((first_full, last_full), *full_box(shape[1:])))
    if last_full <= hi:
        out += [((hi, hi + 1), *b) for b in boxes_of_flat_range(0, stop - hi * inner, shape[1:])]
    return out


def corresponding_sub(sub: Box, src_box: Box, dst_box: Box, transpose: bool = False) -> list[tuple[Box, Box]]:
    """Map ``sub`` (inside ``src_box``, src frame) to the matching region of ``dst_box``.

    ``src_box`` and ``dst_box`` hold the same elements in row-major correspondence
    (``src_box`` read with its dims reversed when ``transpose``). Returns pairs
    ``(src_part, dst_part)`` in their own frames whose union is ``sub``: one pair when
    the region is a box on both sides, several when it is not.
    """
    rel = relative(sub, src_box)
    s_shape = box_shape(src_box)
    if transpose:
        rel, s_shape = transpose_box(rel), tuple(reversed(s_shape))
    d_shape = box_shape(dst_box)
    d_origin = [a for a, _ in dst_box]
    s_origin = [a for a, _ in src_box]
    one = reshape_box(rel, s_shape, d_shape)
    if one is not None:
        return [(sub, translate(one, d_origin))]
    pairs: list[tuple[Box, Box]] = []
    for a, b in flat_runs(rel, s_shape):
        for lo, hi in _cut_rows(a, b, s_shape[-1] if s_shape else 1, d_shape[-1] if d_shape else 1):
            (s_part,) = boxes_of_flat_range(lo, hi, s_shape)
            (d_part,) = boxes_of_flat_range(lo, hi, d_shape)
            src = transpose_box(s_part) if transpose else s_part
            pairs.append((translate(src, s_origin), translate(d_part, d_origin)))
    return pairs


def _cut_rows(a: int, b: int, row_a: int, row_b: int) -> list[Interval]:
    """Cut ``[a, b)`` at every multiple of ``row_a`` or ``row_b`` (rows of both views)."""
    cuts = {a, b}
    for row in (row_a, row_b):
        cuts.update(range((a // row + 1) * row, b, row))
    pts = sorted(cuts)
    return list(zip(pts, pts[1:]))
