"""Geometry of weightbridge.layout.box: exact cases and brute-force properties.

The reference for every property is numpy: a shape's row-major flat indices
(``np.arange(numel).reshape(shape)``) sliced by a box.
"""

from __future__ import annotations

from itertools import pairwise
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightbridge.layout.box import (
    box_numel,
    box_shape,
    boxes_of_flat_range,
    common_refinement,
    contains,
    corresponding_sub,
    flat_runs,
    format_box,
    full_box,
    in_bounds,
    intersect,
    is_empty,
    overlaps,
    relative,
    reshape_box,
    translate,
    transpose_box,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def flat_ids(box, shape) -> np.ndarray:
    """Row-major flat indices of ``box`` in ``shape``, in row-major order of the box."""
    return np.arange(prod(shape), dtype=np.int64).reshape(shape)[tuple(slice(a, b) for a, b in box)].ravel()


# ---------------------------------------------------------------------------------------------
# Exact cases
# ---------------------------------------------------------------------------------------------


class TestIntersectContains:
    def test_overlap(self):
        assert intersect(((0, 4), (2, 6)), ((2, 8), (0, 3))) == ((2, 4), (2, 3))

    def test_nested(self):
        assert intersect(((0, 8), (0, 8)), ((2, 3), (4, 6))) == ((2, 3), (4, 6))

    def test_touching_is_empty(self):
        assert intersect(((0, 4),), ((4, 8),)) is None
        assert intersect(((0, 4), (0, 4)), ((0, 4), (4, 5))) is None
        assert not overlaps(((0, 4), (0, 4)), ((4, 8), (0, 4)))

    def test_disjoint_in_one_dim_only(self):
        assert intersect(((0, 4), (0, 2)), ((0, 4), (3, 5))) is None

    def test_zero_dim_boxes(self):
        assert intersect((), ()) == ()
        assert contains((), ())

    def test_dims_must_agree(self):
        with pytest.raises(ValueError):
            intersect(((0, 4),), ((0, 4), (0, 4)))
        with pytest.raises(ValueError):
            contains(((0, 4),), ((0, 4), (0, 4)))

    def test_contains(self):
        outer = ((2, 6), (0, 4))
        assert contains(outer, outer)
        assert contains(outer, ((2, 3), (1, 4)))
        assert not contains(outer, ((1, 3), (1, 4)))
        assert not contains(outer, ((2, 6), (0, 5)))
        assert not contains(((2, 3), (1, 4)), outer)

    def test_relative_translate_transpose(self):
        inner, outer = ((3, 5), (2, 4)), ((2, 6), (1, 7))
        rel = relative(inner, outer)
        assert rel == ((1, 3), (1, 3))
        assert translate(rel, (2, 1)) == inner
        assert transpose_box(((0, 2), (3, 7))) == ((3, 7), (0, 2))
        assert format_box(((0, 4), (8, 16))) == "[0:4, 8:16]"
        assert box_shape(((1, 3), (0, 6))) == (2, 6)
        assert box_numel(((1, 3), (0, 6))) == 12
        assert is_empty(((1, 1), (0, 6))) and not is_empty(((1, 2), (0, 6)))
        assert in_bounds(((0, 4), (0, 6)), (4, 6)) and not in_bounds(((0, 5), (0, 6)), (4, 6))
        assert not in_bounds(((0, 4),), (4, 6))
        assert full_box((4, 6)) == ((0, 4), (0, 6))


class TestReshapeBox:
    # [24] <-> [4, 6]
    @pytest.mark.parametrize(
        "flat, rows",
        [
            (((0, 24),), ((0, 4), (0, 6))),
            (((6, 12),), ((1, 2), (0, 6))),
            (((6, 18),), ((1, 3), (0, 6))),
            (((8, 10),), ((1, 2), (2, 4))),
            (((23, 24),), ((3, 4), (5, 6))),
        ],
    )
    def test_flat_vs_rows_both_ways(self, flat, rows):
        assert reshape_box(flat, [24], [4, 6]) == rows
        assert reshape_box(rows, [4, 6], [24]) == flat

    @pytest.mark.parametrize("flat", [((3, 9),), ((4, 8),), ((5, 13),), ((0, 7),)])
    def test_flat_range_crossing_partial_rows(self, flat):
        assert reshape_box(flat, [24], [4, 6]) is None

    def test_rows_not_contiguous_in_flat(self):
        assert reshape_box(((1, 3), (2, 4)), [4, 6], [24]) is None
        assert reshape_box(((0, 4), (0, 3)), [4, 6], [24]) is None

    def test_common_refinement(self):
        assert common_refinement([24], [4, 6]) == (4, 6)
        assert common_refinement([4, 6], [2, 4, 3]) == (2, 2, 2, 3)
        assert common_refinement([2, 4, 3], [4, 6]) == (2, 2, 2, 3)
        assert common_refinement([1, 4, 1, 6], [24, 1]) == (4, 6)

    @pytest.mark.parametrize(
        "box, other",
        [
            (((0, 2), (0, 6)), ((0, 1), (0, 4), (0, 3))),
            (((2, 4), (0, 6)), ((1, 2), (0, 4), (0, 3))),
            (((1, 2), (3, 6)), ((0, 1), (3, 4), (0, 3))),
            (((1, 2), (0, 3)), ((0, 1), (2, 3), (0, 3))),
            (((2, 3), (3, 6)), ((1, 2), (1, 2), (0, 3))),
            (((0, 4), (0, 6)), ((0, 2), (0, 4), (0, 3))),
        ],
    )
    def test_4x6_vs_2x4x3(self, box, other):
        assert reshape_box(box, [4, 6], [2, 4, 3]) == other
        assert reshape_box(other, [2, 4, 3], [4, 6]) == box

    @pytest.mark.parametrize("box", [((1, 3), (0, 6)), ((0, 4), (0, 3)), ((0, 2), (1, 6))])
    def test_4x6_vs_2x4x3_not_a_box(self, box):
        assert reshape_box(box, [4, 6], [2, 4, 3]) is None

    @pytest.mark.parametrize("a, b", [([6, 4], [4, 6]), ([2, 3], [3, 2]), ([5, 6], [6, 5]), ([3, 4], [4, 3])])
    def test_views_that_do_not_nest(self, a, b):
        assert common_refinement(a, b) is None
        assert reshape_box(full_box(a), a, b) is None
        assert reshape_box(((0, 1), (0, a[1])), a, b) is None

    def test_numel_mismatch(self):
        assert common_refinement([6], [4]) is None
        assert reshape_box(((0, 4),), [6], [4]) is None

    def test_unit_dims_expert_slot(self):
        # an expert slot [e:e+1, 0:I, 0:H] vs the expert's own [I, H]
        assert reshape_box(((0, 1), (1, 3), (0, 6)), (1, 4, 6), (4, 6)) == ((1, 3), (0, 6))
        assert reshape_box(((1, 3), (0, 6)), (4, 6), (1, 4, 6)) == ((0, 1), (1, 3), (0, 6))
        assert reshape_box(((0, 1), (2, 3), (0, 1), (0, 6)), (1, 4, 1, 6), (24,)) == ((12, 18),)


class TestFlat:
    def test_flat_runs(self):
        assert flat_runs(((0, 4), (0, 6)), (4, 6)) == [(0, 24)]
        assert flat_runs(((1, 3), (0, 6)), (4, 6)) == [(6, 18)]
        assert flat_runs(((1, 3), (2, 4)), (4, 6)) == [(8, 10), (14, 16)]
        assert flat_runs(((1, 1), (2, 4)), (4, 6)) == []
        assert flat_runs(((0, 2), (1, 2), (0, 3)), (2, 4, 3)) == [(3, 6), (15, 18)]
        assert flat_runs(((0, 2), (0, 4), (1, 2)), (2, 4, 3)) == [(i, i + 1) for i in range(1, 24, 3)]

    def test_boxes_of_flat_range(self):
        assert boxes_of_flat_range(3, 21, [4, 6]) == [((0, 1), (3, 6)), ((1, 3), (0, 6)), ((3, 4), (0, 3))]
        assert boxes_of_flat_range(6, 18, [4, 6]) == [((1, 3), (0, 6))]
        assert boxes_of_flat_range(7, 9, [4, 6]) == [((1, 2), (1, 3))]
        assert boxes_of_flat_range(5, 5, [4, 6]) == []
        assert boxes_of_flat_range(0, 24, [2, 4, 3]) == [((0, 2), (0, 4), (0, 3))]
        assert boxes_of_flat_range(2, 4, [24]) == [((2, 4),)]

    def test_corresponding_sub_transposed(self):
        # canonical [4, 2] stored transposed as local [2, 4]: rows 1:3 of canonical are local cols 1:3
        assert corresponding_sub(((1, 3), (0, 2)), ((0, 4), (0, 2)), ((0, 2), (0, 4)), transpose=True) == [
            (((1, 3), (0, 2)), ((0, 2), (1, 3)))
        ]

    def test_corresponding_sub_non_nesting_views(self):
        # [4, 6] vs [6, 4] do not nest: the first row of src is the first 4 + 2 elements of dst
        pairs = corresponding_sub(((0, 1), (0, 6)), ((0, 4), (0, 6)), ((10, 16), (0, 4)))
        assert pairs == [(((0, 1), (0, 4)), ((10, 11), (0, 4))), (((0, 1), (4, 6)), ((11, 12), (0, 2)))]


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=6)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)


@st.composite
def box_in(draw, shape, allow_empty=False):
    out = []
    for n in shape:
        a = draw(st.integers(0, n if allow_empty else n - 1))
        b = draw(st.integers(a if allow_empty else a + 1, n))
        out.append((a, b))
    return tuple(out)


@st.composite
def shape_and_box(draw, allow_empty=False):
    shape = draw(shapes)
    return shape, draw(box_in(shape, allow_empty))


@st.composite
def factorisation(draw, n, unit_dims=True):
    """A random shape with numel ``n`` (random order of random factors, maybe unit dims)."""
    out = []
    while n > 1:
        d = draw(st.sampled_from([d for d in range(2, n + 1) if n % d == 0]))
        out.append(d)
        n //= d
    out = draw(st.permutations(out)) if out else [1]
    if unit_dims and draw(st.booleans()):
        out = list(out)
        out.insert(draw(st.integers(0, len(out))), 1)
    return tuple(out)


@SETTINGS
@given(shape_and_box(allow_empty=True))
def test_flat_runs_exact_element_set(sb):
    shape, box = sb
    runs = flat_runs(box, shape)
    expect = np.sort(flat_ids(box, shape))
    got = np.concatenate([np.arange(a, b) for a, b in runs]) if runs else np.array([], dtype=np.int64)
    np.testing.assert_array_equal(got, expect)  # in order, no duplicates
    for (_, b), (c, _) in pairwise(runs):
        assert b < c, f"runs {runs} are not maximal"  # never adjacent: maximal
    assert all(a < b for a, b in runs)


@SETTINGS
@given(shape_and_box())
def test_flat_runs_then_boxes_round_trip(sb):
    shape, box = sb
    seen = []
    for a, b in flat_runs(box, shape):
        boxes = boxes_of_flat_range(a, b, shape)
        assert len(boxes) <= 2 * len(shape) - 1
        for x in boxes:
            assert in_bounds(x, shape) and not is_empty(x)
            assert contains(box, x)
            seen.append(flat_ids(x, shape))
    got = np.concatenate(seen)
    np.testing.assert_array_equal(got, np.sort(flat_ids(box, shape)))  # exact set, in order, no dup


@SETTINGS
@given(st.data())
def test_boxes_of_flat_range_exact(data):
    shape = data.draw(shapes)
    n = prod(shape)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    boxes = boxes_of_flat_range(start, stop, shape)
    got = np.concatenate([flat_ids(x, shape) for x in boxes]) if boxes else np.array([], dtype=np.int64)
    np.testing.assert_array_equal(got, np.arange(start, stop))
    assert all(in_bounds(x, shape) and not is_empty(x) for x in boxes)
    assert len(boxes) <= max(1, 2 * len(shape) - 1)


@SETTINGS
@given(st.data())
def test_reshape_box_same_flat_indices(data):
    src_shape, box = data.draw(shape_and_box())
    dst_shape = data.draw(factorisation(prod(src_shape)))
    out = reshape_box(box, src_shape, dst_shape)
    expect = np.sort(flat_ids(box, src_shape))
    if out is not None:
        assert in_bounds(out, dst_shape), (out, dst_shape)
        np.testing.assert_array_equal(flat_ids(out, dst_shape), expect)
        assert reshape_box(out, dst_shape, src_shape) == box
    elif common_refinement(src_shape, dst_shape) is not None:
        # None promised only when the elements are not one box of dst (views nest here)
        coords = np.array(np.unravel_index(expect, dst_shape)).T
        bbox = tuple(zip(coords.min(0).tolist(), (coords.max(0) + 1).tolist()))
        assert box_numel(bbox) != len(expect), f"{format_box(box)} of {src_shape} is {format_box(bbox)} of {dst_shape}"


@SETTINGS
@given(st.data())
def test_common_refinement_refines_both(data):
    a = data.draw(shapes)
    b = data.draw(factorisation(prod(a)))
    ref = common_refinement(a, b)
    if ref is None:
        return
    assert prod(ref) == prod(a) and all(n > 1 for n in ref)

    def prefix(s):
        out, p = set(), 1
        for n in s:
            p *= n
            out.add(p)
        return out

    assert prefix([n for n in a if n != 1]) <= prefix(ref)
    assert prefix([n for n in b if n != 1]) <= prefix(ref)


@st.composite
def correspondence(draw):
    transpose = draw(st.booleans())
    if transpose:
        src_frame = tuple(draw(st.lists(dims, min_size=2, max_size=2)))
    else:
        src_frame = draw(shapes)
    src_box = draw(box_in(src_frame))
    n = box_numel(src_box)
    dst_shape = draw(factorisation(n))
    dst_frame = tuple(m + draw(st.integers(0, 2)) for m in dst_shape)
    dst_origin = [draw(st.integers(0, f - m)) for f, m in zip(dst_frame, dst_shape)]
    dst_box = tuple((o, o + m) for o, m in zip(dst_origin, dst_shape))
    sub = tuple(
        (a, b) for lo, hi in src_box for a in [draw(st.integers(lo, hi - 1))] for b in [draw(st.integers(a + 1, hi))]
    )
    return src_frame, src_box, dst_frame, dst_box, sub, transpose


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(correspondence())
def test_corresponding_sub_matches_brute_force(case):
    src_frame, src_box, dst_frame, dst_box, sub, transpose = case
    S = np.arange(prod(src_frame), dtype=np.int64).reshape(src_frame)
    D = np.arange(prod(dst_frame), dtype=np.int64).reshape(dst_frame)
    sl = lambda b: tuple(slice(x, y) for x, y in b)
    src_view = S[sl(src_box)].T if transpose else S[sl(src_box)]
    brute = dict(zip(src_view.ravel().tolist(), D[sl(dst_box)].ravel().tolist()))

    pairs = corresponding_sub(sub, src_box, dst_box, transpose)
    assert pairs
    covered = []
    for s_part, d_part in pairs:
        assert contains(sub, s_part) and not is_empty(s_part), (s_part, sub)
        assert contains(dst_box, d_part) and not is_empty(d_part), (d_part, dst_box)
        s_elems = S[sl(s_part)].T if transpose else S[sl(s_part)]
        assert s_elems.size == D[sl(d_part)].size
        # row-major correspondence inside the pair is the brute-force correspondence
        assert [brute[x] for x in s_elems.ravel().tolist()] == D[sl(d_part)].ravel().tolist()
        covered.append(S[sl(s_part)].ravel())
    covered = np.sort(np.concatenate(covered))
    np.testing.assert_array_equal(covered, np.sort(S[sl(sub)].ravel()))  # union == sub, no overlap

    rel = relative(sub, src_box)
    s_shape = box_shape(src_box)
    if transpose:
        rel, s_shape = transpose_box(rel), s_shape[::-1]
    if reshape_box(rel, s_shape, box_shape(dst_box)) is not None:
        assert len(pairs) == 1 and pairs[0][0] == sub


def test_zero_numel_shapes_do_not_crash():
    """Zero-size shapes (an empty FSDP chunk is [0, H]) have nothing to align: None, no crash."""
    assert common_refinement([0], [0]) is None
    for a, b in [([0, 4], [4, 0]), ([2, 0], [0]), ([0, 4], [0, 4])]:
        try:
            common_refinement(a, b)
            reshape_box(tuple((0, 0) for _ in a), a, b)
        except ZeroDivisionError as exc:
            pytest.fail(f"common_refinement({a}, {b}) raised {exc!r}")


# ---------------------------------------------------------------------------------------------
# Coverage geometry (weightbridge.layout.coverage) on the same brute-force footing
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(st.data())
def test_union_numel_matches_brute_force(data):
    from weightbridge.layout.coverage import union_numel

    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple))
    boxes = data.draw(st.lists(box_in(shape), min_size=0, max_size=5))
    mask = np.zeros(shape, dtype=bool)
    for b in boxes:
        mask[tuple(slice(x, y) for x, y in b)] = True
    assert union_numel(boxes) == int(mask.sum())


@SETTINGS
@given(st.data())
def test_union_numel_of_shards_along_one_dim_matches_brute_force(data):
    """The shard fast path (boxes equal but along one dim): disjoint, touching, gapped, overlapping."""
    from weightbridge.layout.coverage import union_numel

    shape = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple))
    d = data.draw(st.integers(0, len(shape) - 1))
    rest = [data.draw(st.tuples(st.integers(0, n - 1), st.integers(1, n)).filter(lambda t: t[0] < t[1]))
            for n in shape]
    spans = data.draw(st.lists(st.tuples(st.integers(0, shape[d] - 1), st.integers(1, shape[d]))
                               .filter(lambda t: t[0] < t[1]), min_size=1, max_size=6))
    boxes = [tuple(span if k == d else rest[k] for k in range(len(shape))) for span in spans]
    mask = np.zeros(shape, dtype=bool)
    for b in boxes:
        mask[tuple(slice(x, y) for x, y in b)] = True
    assert union_numel(boxes) == int(mask.sum())


@SETTINGS
@given(st.data())
def test_tiling_problems_finds_exactly_the_overlaps(data):
    from weightbridge.layout.coverage import tiling_problems
    from weightbridge.layout.ir import LocalTensor, Piece

    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple))
    boxes = data.draw(st.lists(box_in(shape), min_size=1, max_size=4))
    pieces = tuple(Piece("c", tuple((0, y - x) for x, y in b), b) for b in boxes)
    counts = np.zeros(shape, dtype=int)
    for b in boxes:
        counts[tuple(slice(x, y) for x, y in b)] += 1
    msgs = tiling_problems(LocalTensor("t", shape, "float32", pieces))
    assert all("overlap" in m for m in msgs)
    assert bool(msgs) == bool((counts > 1).any())
