"""``slice`` and ``permute`` in rules: the expanded boxes hold exactly what numpy's slicing,
``torch.chunk``-style sharding and ``transpose(perm)`` of the canonical tensor give.

Random canonical shapes (1-4 dims), random slices, padding and shard steps over a ``tp`` axis,
random permutations; every rank's local tensor is materialised from its pieces (distinct ids per
canonical element, ``_materialise``) and compared element for element with the reference built
directly from the canonical array. Plus the fused-checkpoint case the vocabulary exists for
(Phi-3's ``qkv_proj`` split by vLLM into per-rank ``[q; k; v]``) and gpt-oss's experts, and the
errors a wrong slice or permutation gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from weightbridge.layout.ir import CanonicalModel, CanonicalTensor
from weightbridge.layout.local_build import MAX_PERMUTE_PIECES
from weightbridge.layout.rules import Rule

from ._materialise import UNWRITTEN, CanonicalIds, build, materialise_rank

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_tensor_model(shape: tuple[int, ...], **params) -> CanonicalModel:
    return CanonicalModel((CanonicalTensor("w", tuple(shape), "float32"),), tuple(sorted(params.items())))


def expand(model: CanonicalModel, tp: int, rules: list[dict]) -> list[dict[str, np.ndarray]]:
    """Every rank's local tensors, materialised from the pieces (asserts no element written twice)."""
    _, layout, problems = build("trainer", "none", {"tp": tp}, model, axes=["tp"], rules=rules)
    assert problems == [], [p.message for p in problems]
    canon = CanonicalIds.of(model)
    return [materialise_rank(r, canon) for r in layout.ranks]


def reference(a: np.ndarray, part: dict, coord: int, tp: int) -> np.ndarray:
    """What a part is, computed with numpy: slice, pad (with UNWRITTEN), torch.chunk, permute."""
    for s in part.get("slice", []):
        stop = a.shape[s["dim"]] if s.get("stop") is None else s["stop"]
        a = np.take(a, range(s.get("start", 0), stop), axis=s["dim"])
    if "pad" in part:
        d, m = part["pad"]["dim"], part["pad"]["multiple"]
        widths = [(0, 0)] * a.ndim
        widths[d] = (0, -(-a.shape[d] // m) * m - a.shape[d])
        a = np.pad(a, widths, constant_values=UNWRITTEN)
    for op in part.get("shard", []):
        n = a.shape[op["dim"]]
        per = -(-n // tp)
        a = np.take(a, range(min(coord * per, n), min((coord + 1) * per, n)), axis=op["dim"])
    if "permute" in part:
        a = np.transpose(a, part["permute"])
    return a


@st.composite
def part_case(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    part: dict = {"canonical": "w"}
    dims = draw(st.lists(st.integers(0, ndim - 1), max_size=2))
    sliced = list(shape)
    slices = []
    for d in dims:
        start = draw(st.integers(0, sliced[d] - 1))
        stop = draw(st.one_of(st.none(), st.integers(start + 1, sliced[d])))
        slices.append({"dim": d, "start": start, "stop": stop})
        sliced[d] = (sliced[d] if stop is None else stop) - start
    if slices:
        part["slice"] = slices
    if draw(st.booleans()):
        part["pad"] = {"dim": draw(st.integers(0, ndim - 1)), "multiple": draw(st.integers(1, 4))}
    tp = draw(st.integers(1, 4))
    if draw(st.booleans()):
        part["shard"] = [{"dim": draw(st.integers(0, ndim - 1)), "axis": "tp", "uneven": True}]
    if draw(st.booleans()):
        part["permute"] = draw(st.permutations(range(ndim)))
    return shape, part, tp


@PROPS
@given(part_case())
def test_slice_pad_shard_permute_equal_numpy(case) -> None:
    shape, part, tp = case
    model = one_tensor_model(shape)
    rule = {"local": "x", **{k: v for k, v in part.items() if k != "canonical"}, "canonical": "w"}
    ranks = expand(model, tp, [rule])
    canon = CanonicalIds.of(model).arrays["w"]
    for coord, tensors in enumerate(ranks):
        want = reference(canon, part, coord, tp)
        got = tensors.get("x")
        if got is None:  # torch.chunk: a trailing rank may hold nothing
            assert want.size == 0 or (want == UNWRITTEN).all()
            continue
        assert got.shape == want.shape
        assert np.array_equal(got, want), (coord, part)


@PROPS
@given(st.lists(st.integers(1, 5), min_size=3, max_size=3), st.integers(1, 3), st.data())
def test_concat_of_slices_of_one_tensor(sizes, tp, data) -> None:
    """A fused tensor [a; b; c] (dim 0) re-split per rank into [a_r; b_r; c_r] (vLLM's QKV of a fused
    checkpoint): every rank's tensor is the concatenation of its chunk of each slice."""
    sizes = [s * tp for s in sizes]
    cols = data.draw(st.integers(1, 4))
    model = one_tensor_model((sum(sizes), cols))
    starts = np.cumsum([0, *sizes])
    parts = [{"canonical": "w", "slice": [{"dim": 0, "start": int(a), "stop": int(b)}], "shard": "column"}
             for a, b in zip(starts, starts[1:])]
    ranks = expand(model, tp, [{"local": "x", "concat": {"dim": 0, "parts": parts}}])
    canon = CanonicalIds.of(model).arrays["w"]
    for r, tensors in enumerate(ranks):
        want = np.concatenate([reference(canon, {**p, "shard": [{"dim": 0}]}, r, tp) for p in parts])
        assert np.array_equal(tensors["x"], want)


def test_phi3_fused_qkv_at_tp2_exact_boxes() -> None:
    """Phi-3 stores qkv_proj = [q (heads*hd); k (kv*hd); v (kv*hd)]; vLLM's rank r holds
    [q heads of r; k heads of r; v heads of r]. Heads 4, kv heads 2, head_dim 3, hidden 5."""
    model = one_tensor_model((4 * 3 + 2 * 2 * 3, 5), num_heads=4, num_kv_heads=2, head_dim=3)
    q, kv = "num_heads * head_dim", "num_kv_heads * head_dim"
    parts = [
        {"canonical": "w", "slice": [{"dim": 0, "stop": q}], "shard": [{"dim": 0, "axis": "tp", "blocks": "num_heads"}]},
        {"canonical": "w", "slice": [{"dim": 0, "start": q, "stop": f"{q} + {kv}"}],
         "shard": [{"dim": 0, "axis": "tp", "blocks": "num_kv_heads"}]},
        {"canonical": "w", "slice": [{"dim": 0, "start": f"{q} + {kv}"}],
         "shard": [{"dim": 0, "axis": "tp", "blocks": "num_kv_heads"}]},
    ]
    _, layout, problems = build("trainer", "none", {"tp": 2}, model, axes=["tp"],
                                rules=[{"local": "qkv", "concat": {"dim": 0, "parts": parts}}])
    assert problems == []
    boxes = [[(p.canonical_box, p.local_box) for p in r.tensor("qkv").pieces] for r in layout.ranks]
    assert boxes[0] == [(((0, 6), (0, 5)), ((0, 6), (0, 5))), (((12, 15), (0, 5)), ((6, 9), (0, 5))),
                        (((18, 21), (0, 5)), ((9, 12), (0, 5)))]
    assert boxes[1] == [(((6, 12), (0, 5)), ((0, 6), (0, 5))), (((15, 18), (0, 5)), ((6, 9), (0, 5))),
                        (((21, 24), (0, 5)), ((9, 12), (0, 5)))]


def test_gpt_oss_experts_permuted_per_expert() -> None:
    """gpt-oss: checkpoint gate_up_proj [E, H, 2I]; vLLM holds w13 [E, 2I/tp, H] (columns sharded,
    then permute(0, 2, 1)): one transposed [1, H, 2I/tp] piece per expert."""
    model = one_tensor_model((3, 4, 8))
    rule = {"local": "w13", "canonical": "w", "shard": [{"dim": 2, "axis": "tp"}], "permute": [0, 2, 1]}
    _, layout, problems = build("trainer", "none", {"tp": 2}, model, axes=["tp"], rules=[rule])
    assert problems == []
    t = layout.ranks[1].tensor("w13")
    assert t.shape == (3, 4, 4)
    assert [(p.canonical_box, p.local_box, p.transpose) for p in t.pieces] == [
        (((e, e + 1), (0, 4), (4, 8)), ((e, e + 1), (0, 4), (0, 4)), True) for e in range(3)
    ]
    canon = CanonicalIds.of(model).arrays["w"]
    got = materialise_rank(layout.ranks[1], CanonicalIds.of(model))["w13"]
    assert np.array_equal(got, canon[:, :, 4:8].transpose(0, 2, 1))


def test_full_reversal_is_one_piece() -> None:
    model = one_tensor_model((2, 3, 4))
    _, layout, problems = build("trainer", "none", {"tp": 1}, model, axes=["tp"],
                                rules=[{"local": "x", "canonical": "w", "permute": [2, 1, 0]}])
    assert problems == []
    (p,) = layout.ranks[0].tensor("x").pieces
    assert p.transpose and p.local_box == ((0, 4), (0, 3), (0, 2))


@pytest.mark.parametrize(("rule", "message"), [
    ({"slice": [{"dim": 2, "stop": 1}]}, "w: slice dim 2 out of range for shape (4, 6)"),
    ({"slice": [{"dim": 0, "start": 3, "stop": 3}]}, "w: slice [3:3] of dim 0 is not inside its extent 4"),
    ({"slice": [{"dim": 1, "start": 2}, {"dim": 1, "stop": 5}]}, "w: slice [0:5] of dim 1 is not inside its extent 4"),
    ({"permute": [0, 2, 1]}, "w: permute [0, 2, 1] has 3 dims, the tensor 2 (4, 6)"),
    ({"transpose": True, "slice": [{"dim": 0, "stop": 2}], "shard": "column"}, None),
])
def test_slice_and_permute_errors_name_the_rule(rule: dict, message: str | None) -> None:
    model = one_tensor_model((4, 6))
    _, _, problems = build("trainer", "none", {"tp": 2}, model, axes=["tp"],
                           rules=[{"local": "x", "canonical": "w", **rule}])
    if message is None:
        assert problems == []
    else:
        assert [p.message for p in problems] == [message]


def test_too_many_permute_pieces_is_a_problem_not_a_hang() -> None:
    n = MAX_PERMUTE_PIECES + 1
    model = one_tensor_model((n, n, n))  # [0, 2, 1]: every choice of dims to cut gives n pieces
    _, _, problems = build("trainer", "none", {"tp": 1}, model, axes=["tp"],
                           rules=[{"local": "x", "canonical": "w", "permute": [0, 2, 1]}])
    assert len(problems) == 1 and f"needs {n:,} pieces" in problems[0].message


@pytest.mark.parametrize(("fields", "message"), [
    ({"permute": [0, 0]}, "permute must be a permutation of 0..1, got [0, 0]"),
    ({"permute": [1, 0], "transpose": True}, "transpose and permute both given"),
    ({"permute": list(range(9))}, "permute of 9 dims; at most 8"),
])
def test_bad_permutations_are_spec_errors(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Rule(local="x", canonical="w", **fields)
    with pytest.raises(ValidationError, match="go with 'canonical'"):
        Rule(local="x", concat={"dim": 0, "parts": [{"canonical": "w"}]}, slice=[{"dim": 0, "stop": 1}])
