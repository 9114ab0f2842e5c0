"""pack/unpack against a brute-force element-by-element reference (no processes)."""

from __future__ import annotations

import itertools
from math import prod

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.layout.box import box_shape
from weightbridge.layout.ir import dtype_bytes
from weightbridge.plan.types import LocalCopy, WireItem
from weightbridge.tensors import apply_local_copies, bitwise_equal, pack_items, torch_dtype, unpack_items
from weightbridge.transport import backend_for, chunk_bounds
from weightbridge.transport.wire import checksum, poly_hash


def item(canonical_box, src, src_box, dst, dst_box, dtype="float32", src_t=False, dst_t=False, name="w") -> WireItem:
    n = prod(b - a for a, b in canonical_box)
    return WireItem(name, canonical_box, src, src_box, src_t, dst, dst_box, dst_t, dtype, n * dtype_bytes(dtype))


def unravel(k: int, shape) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(k % n)
        k //= n
    return tuple(reversed(out))


def local_index(k: int, canonical_box, local_box, transpose: bool) -> tuple[int, ...]:
    """Local index holding the k-th (row-major) element of canonical_box -- by the definition in ir.Piece."""
    cshape = box_shape(canonical_box)
    if transpose:
        c = unravel(k, cshape)
        rshape = tuple(reversed(cshape))
        k = 0
        for i, n in zip(reversed(c), rshape):
            k = k * n + i
    rel = unravel(k, box_shape(local_box))
    return tuple(a + i for (a, _), i in zip(local_box, rel))


def brute_pack(items, tensors) -> torch.Tensor:
    chunks = []
    for it in items:
        n = prod(box_shape(it.canonical_box))
        vals = [tensors[it.src_tensor][local_index(k, it.canonical_box, it.src_box, it.src_transpose)] for k in range(n)]
        t = torch.stack(vals).to(torch_dtype(it.dtype)) if vals else torch.empty(0, dtype=torch_dtype(it.dtype))
        chunks.append(t.contiguous().view(torch.uint8))
    return torch.cat(chunks)


def brute_unpack(items, buf, tensors) -> None:
    off = 0
    for it in items:
        n = prod(box_shape(it.canonical_box))
        vals = buf[off : off + it.nbytes].clone().view(torch_dtype(it.dtype))
        for k in range(n):
            dst = tensors[it.dst_tensor]
            dst[local_index(k, it.canonical_box, it.dst_box, it.dst_transpose)] = vals[k].to(dst.dtype)
        off += it.nbytes


def rand(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


CASES = {
    # same shape, plain sub-box
    "plain": ([item(((2, 5), (1, 4)), "a", ((0, 3), (2, 5)), "b", ((4, 7), (0, 3)))], {"a": (6, 8)}, {"b": (8, 3)}),
    # transposed on the sender (Megatron-style [in, out]) and on the receiver
    "transpose": (
        [
            item(((0, 3), (0, 5)), "a", ((1, 6), (2, 5)), "b", ((0, 3), (0, 5)), src_t=True),
            item(((3, 4), (0, 5)), "a", ((1, 6), (5, 6)), "c", ((0, 5), (1, 2)), src_t=True, dst_t=True),
        ],
        {"a": (7, 6)},
        {"b": (3, 5), "c": (5, 2)},
    ),
    # stacked expert slot [1, I, H] <-> canonical [I, H]
    "stacked": (
        [
            item(((0, 4), (0, 6)), "fc1", ((0, 4), (0, 6)), "w13", ((1, 2), (4, 8), (0, 6))),
            item(((0, 4), (0, 6)), "fc1", ((0, 4), (0, 6)), "w13", ((0, 1), (0, 4), (0, 6)), name="g"),
        ],
        {"fc1": (4, 6)},
        {"w13": (2, 8, 6)},
    ),
    # different factorisation: canonical [4, 6] rows held as a flat [24] slice
    "reshape": ([item(((1, 3), (0, 6)), "flat", ((6, 18),), "m", ((2, 4), (0, 6)))], {"flat": (30,)}, {"m": (5, 6)}),
    # fp32 source -> bf16 wire -> bf16 destination
    "cast": ([item(((0, 4), (0, 8)), "a", ((0, 4), (0, 8)), "b", ((0, 4), (8, 16)), dtype="bfloat16")], {"a": (4, 8)}, {"b": (4, 16)}),
    # odd-sized bf16 item followed by an fp32 item: the fp32 item sits at a misaligned offset
    "misaligned": (
        [
            item(((0, 3),), "v", ((0, 3),), "x", ((1, 4),), dtype="bfloat16"),
            item(((0, 2), (0, 3)), "m", ((1, 3), (0, 3)), "y", ((0, 2), (0, 3))),
        ],
        {"v": (3,), "m": (3, 3)},
        {"x": (4,), "y": (2, 3)},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pack_matches_brute_force(case: str) -> None:
    items, src_shapes, dst_shapes = CASES[case]
    src = {k: rand(s, seed=i) for i, (k, s) in enumerate(src_shapes.items())}
    want = brute_pack(items, src)
    buf = torch.full((sum(it.nbytes for it in items),), 0xAB, dtype=torch.uint8)
    end = pack_items(items, src, buf)
    assert end == buf.numel()
    assert torch.equal(buf, want)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
def test_unpack_matches_brute_force(case: str, dst_dtype: torch.dtype) -> None:
    items, src_shapes, dst_shapes = CASES[case]
    src = {k: rand(s, seed=i) for i, (k, s) in enumerate(src_shapes.items())}
    buf = brute_pack(items, src)
    got = {k: torch.full(s, 7.0, dtype=dst_dtype) for k, s in dst_shapes.items()}
    want = {k: v.clone() for k, v in got.items()}
    unpack_items(items, buf, got)
    brute_unpack(items, buf, want)
    for k in got:
        assert bitwise_equal(got[k], want[k]), k


def test_pack_touches_only_boxes_and_offsets() -> None:
    items, src_shapes, _ = CASES["plain"]
    src = {"a": rand(src_shapes["a"])}
    n = items[0].nbytes
    buf = torch.full((n + 20,), 0xAB, dtype=torch.uint8)
    assert pack_items(items, src, buf, offset=10) == 10 + n
    assert torch.all(buf[:10] == 0xAB) and torch.all(buf[10 + n :] == 0xAB)
    with pytest.raises(ValueError, match="too small"):
        pack_items(items, src, torch.empty(n - 1, dtype=torch.uint8))


def test_fp32_to_bf16_rounding_is_torch_cast() -> None:
    src = {"a": rand((4, 8)) * 1e3}
    it = item(((0, 4), (0, 8)), "a", ((0, 4), (0, 8)), "b", ((0, 4), (0, 8)), dtype="bfloat16")
    buf = torch.empty(it.nbytes, dtype=torch.uint8)
    pack_items([it], src, buf)
    dst = {"b": torch.zeros(4, 8, dtype=torch.bfloat16)}
    unpack_items([it], buf, dst)
    assert bitwise_equal(dst["b"], src["a"].to(torch.bfloat16))


def test_apply_local_copies() -> None:
    t = {"embed": rand((6, 4)), "head": torch.zeros(6, 4), "headT": torch.zeros(4, 6)}
    copies = [
        LocalCopy(0, "e", ((0, 6), (0, 4)), "embed", ((0, 6), (0, 4)), False, "head", ((0, 6), (0, 4)), False),
        LocalCopy(0, "e", ((0, 6), (0, 4)), "embed", ((0, 6), (0, 4)), False, "headT", ((0, 4), (0, 6)), True),
        LocalCopy(1, "e", ((0, 6), (0, 4)), "embed", ((0, 6), (0, 4)), False, "head", ((0, 6), (0, 4)), False),
    ]
    assert apply_local_copies(copies, t, rank=0) == 2
    assert bitwise_equal(t["head"], t["embed"]) and bitwise_equal(t["headT"], t["embed"].T.contiguous())


def test_chunk_bounds_cover_exactly() -> None:
    assert chunk_bounds(0, 4) == []
    for n, c in itertools.product([1, 7, 8, 9, 100], [1, 3, 8, 64]):
        cuts = chunk_bounds(n, c)
        assert cuts[0][0] == 0 and cuts[-1][1] == n
        assert all(b - a <= c and b > a for a, b in cuts)
        assert all(x[1] == y[0] for x, y in zip(cuts, cuts[1:]))


def test_backend_for() -> None:
    assert backend_for("auto", torch.device("cpu")) == "gloo"
    assert backend_for("auto", "cuda:0") == "nccl"
    assert backend_for("gloo", "cuda:1") == "gloo"
    with pytest.raises(ValueError):
        backend_for("nccl", "cpu")
    with pytest.raises(ValueError):
        backend_for("mpi", "cpu")


def test_checksum_sees_flips_and_swaps() -> None:
    x = torch.randint(0, 256, (1000,), dtype=torch.uint8)
    y = x.clone()
    y[10] ^= 1
    z = x.clone()
    z[[3, 4]] = x[[4, 3]]
    for fn in (checksum, poly_hash):
        assert fn(x) == fn(x.clone()) and fn(x) != fn(y)
        if x[3] != x[4]:
            assert fn(x) != fn(z)


# -- direct messages (weightbridge.transport.wire.split_items, weightbridge.tensors.direct_view) --------

def test_split_items_keeps_item_order_and_cuts_on_size_only() -> None:
    from weightbridge.transport.wire import split_items

    its = tuple(item(((0, n),), "a", ((0, n),), "b", ((0, n),)) for n in (1, 300, 2, 256, 7))  # 4 B per element
    packed, direct = split_items(its, 1024)
    assert [it.nbytes for it in packed] == [4, 8, 28] and [it.nbytes for it in direct] == [1200, 1024]
    assert split_items(its, 1 << 20) == (its, ())


@pytest.mark.parametrize(("box", "transpose", "dtype", "shared"), [
    (((1, 3), (0, 6)), False, "float32", True),     # whole rows: contiguous
    (((2, 3), (1, 4)), False, "float32", True),     # part of one row: contiguous
    (((0, 4), (0, 3)), False, "float32", False),    # left columns: strided
    (((0, 4), (0, 6)), True, "float32", False),     # transposed: not canonical order
    (((0, 4), (0, 6)), False, "bfloat16", False),   # another dtype: a cast is needed
])
def test_direct_view_is_the_tensor_itself_only_when_it_holds_the_wire_bytes(box, transpose, dtype, shared) -> None:
    from weightbridge.tensors import direct_view, read_canonical

    t = torch.arange(24, dtype=torch.float32).view(4, 6)
    v = direct_view(t, box, transpose, dtype, torch.device("cpu"))
    if not shared:
        assert v is None
        return
    assert v is not None and v.dtype == torch.uint8
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()  # no copy
    want = read_canonical(t, box, False, box_shape(box)).reshape(-1)
    assert bitwise_equal(v.view(torch.float32), want)
    v.view(torch.float32).fill_(-1.0)  # writing the view writes the tensor
    assert (t[tuple(slice(a, b) for a, b in box)] == -1.0).all()


def test_a_bucket_in_several_messages_has_one_trailer_and_one_message_keeps_its_checksum() -> None:
    from weightbridge.transport.wire import combine_checksums

    assert combine_checksums([0x1234]) == 0x1234
    a, b = combine_checksums([1, 2]), combine_checksums([2, 1])
    assert a != b and 0 <= a < 1 << 63


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_copy_runs_pack_and_unpack_like_brute_force(data) -> None:
    """Items that follow each other in one contiguous tensor go as one copy (``copy_runs``): row blocks of
    2-D tensors in order (merge), shuffled (no merge), partial columns (a range only for one row), mixed
    wire dtypes (never merged across), tensors stored transposed (not contiguous: per item)."""
    shapes = data.draw(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 5)), min_size=1, max_size=3))
    stored_t = {k: data.draw(st.booleans()) for k in range(len(shapes))}
    items = []
    for k, (rows, cols) in enumerate(shapes):
        cuts = sorted(set(data.draw(st.lists(st.integers(1, rows - 1), max_size=3)))) if rows > 1 else []
        for a, b in zip([0, *cuts], [*cuts, rows]):
            cb = ((a, b), (0, cols if data.draw(st.booleans()) else max(1, cols - 1)))
            dtype = data.draw(st.sampled_from(["float32", "float32", "bfloat16"]))
            items.append(item(cb, f"s{k}", cb, f"d{k}", cb, dtype=dtype, name=f"c{k}"))
    if data.draw(st.booleans()):
        items = data.draw(st.permutations(items))

    def tensor(k: int, rows: int, cols: int, seed: int) -> torch.Tensor:
        t = rand((cols, rows) if stored_t[k] else (rows, cols), seed=seed)
        return t.T if stored_t[k] else t

    src = {f"s{k}": tensor(k, r, c, k) for k, (r, c) in enumerate(shapes)}
    want = brute_pack(items, src)
    buf = torch.zeros(want.numel(), dtype=torch.uint8)
    assert pack_items(items, src, buf) == want.numel()
    assert torch.equal(buf, want)
    got = {f"d{k}": torch.zeros_like(tensor(k, r, c, 0)) for k, (r, c) in enumerate(shapes)}
    ref = {name: t.clone() for name, t in got.items()}
    unpack_items(items, buf, got)
    brute_unpack(items, buf, ref)
    assert all(bitwise_equal(got[n], ref[n]) for n in got)


def test_consecutive_items_of_one_tensor_are_one_copy() -> None:
    """vLLM's fused tensors (w13 = [gate; up] per expert, qkv) receive many items in a row."""
    from weightbridge.tensors import copy_runs

    rows = [item(((0, 2), (0, 4)), "a", ((2 * k, 2 * k + 2), (0, 4)), "w", ((2 * k, 2 * k + 2), (0, 4)), name=f"e{k}")
            for k in range(4)]
    tensors = {"w": torch.zeros(8, 4), "a": torch.zeros(8, 4)}
    assert copy_runs(rows, tensors, 16, dst=True) == [("w", 0, 32, "float32", 16, 128)]
    gap = rows[:2] + rows[3:]
    assert [r[1:3] for r in copy_runs(gap, tensors, 0, dst=True)] == [(0, 16), (24, 8)]
    cast = rows[:2] + [rows[2]._replace(dtype="bfloat16", nbytes=16)]
    assert len(copy_runs(cast, tensors, 0, dst=True)) == 2  # another wire dtype: not merged
    assert [len(r) for r in copy_runs(rows, {"w": torch.zeros(4, 8).T, "a": tensors["a"]}, 0, dst=True)] == [2] * 4


def test_a_cast_one_element_box_of_a_strided_tensor_at_a_misaligned_offset() -> None:
    """Found by the property test above: staging such an item raised ``stride(-1) must be 1`` (a size-1 box
    of a tensor stored transposed counts as contiguous but keeps its stride through ``.to()``)."""
    src = {"v": torch.ones(1), "s": rand((1, 3)).T}
    items = [item(((0, 1),), "v", ((0, 1),), "x", ((0, 1),), dtype="int8"),
             item(((2, 3), (0, 1)), "s", ((2, 3), (0, 1)), "y", ((2, 3), (0, 1)), dtype="bfloat16")]
    buf = torch.zeros(3, dtype=torch.uint8)
    pack_items(items, src, buf)  # the bfloat16 item at offset 1
    assert torch.equal(buf, brute_pack(items, src))
