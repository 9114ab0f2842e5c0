"""Codes, compression into pieces, normalisation and the element-level diff fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, LocalTensor, Piece, RankLayout
from weightbridge.probe import probe_loader
from weightbridge.probe.compress import IdSpace, compress, normalize_pieces
from weightbridge.probe.diff import diff_layouts
from weightbridge.probe.encode import INVALID, CodeBook
from weightbridge.tensors import dtype_name

DTYPE_SETS = [
    [torch.bfloat16],
    [torch.float32],
    [torch.float64],
    [torch.bfloat16, torch.float32],
    [torch.float16, torch.bfloat16],
    [torch.float8_e4m3fn, torch.bfloat16],
    [torch.float8_e5m2],
]


@pytest.mark.parametrize("dtypes", DTYPE_SETS, ids=lambda ds: "+".join(dtype_name(d) for d in ds))
def test_codes_are_exact_normal_and_decode_in_every_dtype(dtypes) -> None:
    book = CodeBook.for_dtypes(dtypes)
    k = torch.arange(1 << book.width) if book.width <= 16 else torch.randint(0, 1 << book.width, (50_000,))
    ref = book.encode(k)
    assert bool((ref != 0).all()) and bool(torch.isfinite(ref).all())
    for d in dtypes:
        v = book.encode_as(k, d)
        assert torch.equal(v.double(), ref), d  # exactly representable: casts keep the value
        assert torch.equal(book.decode_fast(v), k) and torch.equal(book.decode(v), k)
        if d.is_floating_point and d.itemsize >= 2:
            assert bool((v.double().abs() >= torch.finfo(d).tiny).all())  # no denormals


def test_non_codes_decode_invalid_or_zero() -> None:
    book = CodeBook.for_dtypes([torch.bfloat16])
    x = torch.tensor([0.0, -0.0, float("nan"), float("inf"), 1e-40, 3.0e38, 1.0 + 2**-10], dtype=torch.float32)
    assert book.decode(x).tolist() == [-2, -2, INVALID, INVALID, INVALID, INVALID, INVALID]


def test_widths() -> None:
    assert CodeBook.for_dtypes([torch.bfloat16]).width == 15
    assert CodeBook.for_dtypes([torch.bfloat16, torch.float32]).width == 15
    assert CodeBook.for_dtypes([torch.float32]).width == 31
    assert CodeBook.for_dtypes([torch.bfloat16]).chunks(7_600_000_000) == 3


def _model() -> tuple[CanonicalModel, IdSpace]:
    m = CanonicalModel((CanonicalTensor("a", (4, 6), "float32"), CanonicalTensor("b", (3, 4), "float32")))
    return m, IdSpace.of(m)


def test_compress_rectangles_transposes_and_padding() -> None:
    _, ids = _model()
    a = np.arange(24).reshape(4, 6)
    b = 24 + np.arange(12).reshape(3, 4)
    g = np.full((10, 6), -1)
    g[0:4] = a
    g[4:8, 0:3] = b.T
    g[8, 0:2] = a[1, 2:4]  # a 1-row piece
    pieces = compress(g.copy(), ids)
    assert pieces == [
        Piece("a", ((0, 4), (0, 6)), ((0, 4), (0, 6))),
        Piece("b", ((0, 3), (0, 4)), ((4, 8), (0, 3)), True),
        Piece("a", ((1, 2), (2, 4)), ((8, 9), (0, 2))),
    ]
    tiles = compress(g[:3].copy(), ids) + compress(g[3:].copy(), ids, row_offset=3)
    assert normalize_pieces(tiles) == normalize_pieces(pieces)


def test_diff_element_fallback_and_differences() -> None:
    # the same 4x6 region as one piece, as rows, and as two column blocks: all equal
    one = (Piece("a", ((0, 4), (0, 6)), ((0, 4), (0, 6))),)
    cols = (Piece("a", ((0, 4), (0, 3)), ((0, 4), (0, 3))), Piece("a", ((0, 4), (3, 6)), ((0, 4), (3, 6))))
    rows = tuple(Piece("a", ((r, r + 1), (0, 6)), ((r, r + 1), (0, 6))) for r in (3, 1, 0, 2))
    lay = [RankLayout("rollout", 0, (LocalTensor("x", (4, 6), "float32", ps),)) for ps in (one, cols, rows)]
    assert diff_layouts(lay[0], lay[1]) == [] and diff_layouts(lay[1], lay[2]) == []
    shifted = (Piece("a", ((0, 4), (0, 6)), ((0, 4), (0, 6))),)
    other = RankLayout("rollout", 0, (LocalTensor("x", (5, 6), "float32", shifted),))
    assert "shape" in diff_layouts(lay[0], other)[0].message
    wrong_pieces = (Piece("b", ((0, 3), (0, 4)), ((0, 3), (0, 4))),)
    wrong = RankLayout("rollout", 0, (LocalTensor("x", (4, 6), "float32", wrong_pieces),))
    d = diff_layouts(lay[0], wrong)
    assert len(d) == 1 and d[0].only_a == one and d[0].only_b[0].canonical == "b"


def test_loader_that_replaces_parameters() -> None:
    """Fresh destination handles after every call (MoE weight fusion replaces tensors)."""
    m, _ = _model()
    holder = {"w": torch.nn.Parameter(torch.randn(6, 4)), "b": torch.nn.Parameter(torch.randn(3, 4))}
    original = {n: t.detach().clone() for n, t in holder.items()}

    def load(weights):
        for name, w in weights:
            if name == "a":
                holder["w"] = torch.nn.Parameter(w.T.contiguous().clone())  # a new tensor each call
            else:
                holder["b"].data.copy_(w)

    res = probe_loader(m, load, lambda: dict(holder))
    assert res.ok
    (p,) = res.layout.tensor("w").pieces
    assert p == Piece("a", ((0, 4), (0, 6)), ((0, 6), (0, 4)), True)
    assert torch.equal(holder["b"], original["b"]) and holder["w"].shape == original["w"].shape
    assert torch.equal(holder["w"], original["w"])  # restored into the replacing tensor
