"""Probing the synthetic loader zoo recovers exact IRs, with the expected number of loader calls."""

from __future__ import annotations

import pytest
import torch

from weightbridge.layout.ir import LocalTensor, Piece, RankLayout
from weightbridge.probe import probe_loader
from weightbridge.probe.compress import IdSpace
from weightbridge.probe.diff import diff_layouts, format_diff
from weightbridge.probe.encode import CodeBook

from ._zoo import HfLike, MegatronLike, VllmLike, expand, qwen_like


def expected_chunks(model, dtypes) -> int:
    """ceil(bits(#canonical elements) / code width), computed independently of the prober."""
    width = CodeBook.for_dtypes(dtypes).width
    return -(-IdSpace.of(model).total.bit_length() // width)


def probe(engine, model, **kw):
    before = {n: t.detach().clone() for n, t in engine.params().items()}
    res = probe_loader(model, engine.load_weights, engine.params, **kw)
    after = engine.params()
    assert all(torch.equal(before[n], after[n]) for n in before), "destinations not restored"
    assert engine.calls == res.calls + res.verify_calls
    return res


def assert_same(got: RankLayout, want: RankLayout, **kw) -> None:
    d = diff_layouts(got, want, **kw)
    assert not d, "\n" + format_diff(d)


DENSE = qwen_like()  # vocab 100 (padded to 128 by vLLM), 4 heads, 2 kv heads, biases


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vllm_fused_qkv_gate_up_padded_vocab(tp: int) -> None:
    """Fused qkv (kv heads replicated at tp=4 > 2 kv heads), gate_up, padded vocab-parallel embedding."""
    want = expand("vllm", {"tp": tp}, DENSE)
    for rank in range(tp):
        eng = VllmLike(DENSE, tp, rank)
        res = probe(eng, DENSE, rank=rank)
        assert res.ok, res.summary()
        assert res.calls == res.chunks == expected_chunks(DENSE, [torch.bfloat16]) == 1
        assert_same(res.layout, want.ranks[rank])
        emb = res.layout.tensor("model.embed_tokens.weight")
        mapped_rows = sum(p.local_box[0][1] - p.local_box[0][0] for p in emb.pieces)
        assert mapped_rows == min(128 // tp, max(0, 100 - rank * 128 // tp))  # padding rows map to nothing


def test_several_chunks_and_call_count() -> None:
    big = qwen_like(vocab=1200, layers=1)  # > 2^15 elements: two 15-bit chunks for bf16
    n_chunks = expected_chunks(big, [torch.bfloat16])
    assert n_chunks == 2
    eng = VllmLike(big, 2, 1)
    res = probe(eng, big, rank=1)
    assert res.ok and res.calls == res.chunks == n_chunks and res.rounds == 1
    assert eng.calls == n_chunks + 1  # + one verification load
    assert_same(res.layout, expand("vllm", {"tp": 2}, big).ranks[1])


def test_vllm_stacked_experts_and_qk_norm() -> None:
    moe = qwen_like(experts=4, qk_norm=True, bias=False)
    want = expand("vllm", {"tp": 2}, moe)
    for rank in range(2):
        res = probe(VllmLike(moe, 2, rank), moe, rank=rank)
        assert res.ok, res.summary()
        assert_same(res.layout, want.ranks[rank])
        w13 = res.layout.tensor("model.layers.0.mlp.experts.routed_experts.w13_weight")
        assert w13.shape == (4, 16, 32) and len(w13.pieces) == 8  # [gate; up] per expert


def test_megatron_interleaved_gqa() -> None:
    m = qwen_like(bias=False, heads=8, kv=4, head_dim=4)
    want = expand("megatron", {"tp": 2}, m)
    for rank in range(2):
        res = probe(MegatronLike(m, 2, rank), m, rank=rank)
        assert res.ok, res.summary()
        assert_same(res.layout, want.ranks[rank])
        qkv = res.layout.tensor("decoder.layers.0.self_attention.linear_qkv.weight")
        assert len(qkv.pieces) == 6  # 2 local query groups x [q; k; v]


def test_tied_lm_head_one_canonical_two_destinations() -> None:
    tied = qwen_like(tied=True, layers=1)
    res = probe(HfLike(tied), tied)
    assert res.ok
    assert_same(res.layout, expand("hf", {}, tied).ranks[0])
    assert [p.canonical for p in res.layout.tensor("lm_head.weight").pieces] == ["model.embed_tokens.weight"]


def test_transposed_storage() -> None:
    m = qwen_like(layers=1)
    names = {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    res = probe(HfLike(m, transposed=names), m)
    assert res.ok
    want = expand("hf", {}, m).ranks[0]
    tensors = []
    for t in want.tensors:
        if t.name in names:
            (p,) = t.pieces
            piece = Piece(p.canonical, p.canonical_box, p.local_box[::-1], True)
            t = LocalTensor(t.name, t.shape[::-1], t.dtype, (piece,))
        tensors.append(t)
    assert_same(res.layout, RankLayout("rollout", 0, tuple(tensors)))
    assert res.layout.tensor("model.layers.0.mlp.down_proj.weight").pieces[0].transpose


def test_dtype_casts_are_mapped_and_reported() -> None:
    """bf16 canonical -> fp32 parameters (widening) and fp32 canonical -> bf16 (narrowing):
    the codes are exact in both dtypes, so cast elements map to their true source."""
    res = probe(VllmLike(DENSE, 2, 1, dtypes={"*": torch.float32}), DENSE, rank=1)
    assert res.ok and res.code_width == 15
    assert_same(res.layout, expand("vllm", {"tp": 2}, DENSE, dtype="float32").ranks[1])
    assert {c.split(' ')[0] for c in res.casts} == {t.name for t in res.layout.tensors}
    # only the norms in fp32 (a mixed-dtype engine): two dtype groups, still one call per chunk
    norms = {n: torch.float32 for n in ("model.norm.weight", "model.layers.0.input_layernorm.weight")}
    res = probe(VllmLike(DENSE, 2, 0, dtypes=norms), DENSE, rank=0)
    assert res.ok and res.calls == 1
    assert_same(res.layout, expand("vllm", {"tp": 2}, DENSE).ranks[0], dtypes=False)
    assert sorted(c.split(" ")[0] for c in res.casts) == sorted(norms)
    f32 = qwen_like(dtype="float32", layers=1)
    res = probe(VllmLike(f32, 2, 1, dtypes={"*": torch.bfloat16}), f32, rank=1)
    assert res.ok
    assert_same(res.layout, expand("vllm", {"tp": 2}, f32, dtype="bfloat16").ranks[1])


def test_numerical_changes_are_reported_not_mapped() -> None:
    m = DENSE  # one chunk: a scaled code is another valid code (wrong id), caught by verification
    changed = {"model.layers.1.mlp.down_proj.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight"}
    scaled = {"model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"}
    eng = HfLike(m, scale=scaled, shift={"model.norm.weight"})
    res = probe(eng, m)
    assert not res.ok and not res.verified
    assert set(res.changed) == changed, res.summary()
    assert "differ from the IR replay" in res.changed["model.layers.0.self_attn.q_proj.weight"]
    want = expand("hf", {}, m).ranks[0]
    want = RankLayout("rollout", 0, tuple(t for t in want.tensors if t.name not in changed))
    assert_same(res.layout, want)


def test_memory_cap_probes_in_rounds() -> None:
    eng = VllmLike(DENSE, 2, 0)
    full = probe(eng, DENSE)
    eng2 = VllmLike(DENSE, 2, 0)
    cap = 16 * 1024  # 1024 decode elements per round, 1024-element code slices
    res = probe(eng2, DENSE, max_probe_bytes=cap)
    biggest = max(t.numel for t in full.layout.tensors)
    assert res.rounds >= sum(t.numel for t in full.layout.tensors) // 1024 and res.rounds > 1
    assert biggest > 1024  # large tensors were tiled by rows
    assert res.calls == res.rounds * res.chunks
    assert res.ok
    assert_same(res.layout, full.layout)
    assert res.layout.digest() == full.layout.digest()


def test_restores_destinations_on_error() -> None:
    eng = VllmLike(DENSE, 1, 0)
    before = {n: t.detach().clone() for n, t in eng.params().items()}

    def bad_loader(weights):
        with torch.no_grad():
            for i, (name, w) in enumerate(weights):
                eng.load_one(name, w)
                if i == 5:
                    raise RuntimeError("loader failed")

    with pytest.raises(RuntimeError, match="loader failed"):
        probe_loader(DENSE, bad_loader, eng.params)
    assert all(torch.equal(before[n], t) for n, t in eng.params().items())


def test_every_call_sees_every_name() -> None:
    seen: list[list[str]] = []
    eng = VllmLike(DENSE, 2, 1)

    def loader(weights):
        names = []
        for name, w in weights:
            names.append(name)
            eng.load_one(name, w)
        seen.append(names)

    with torch.no_grad():
        res = probe_loader(DENSE, loader, eng.params, rank=1)
    assert len(seen) == res.calls + 1
    assert all(names == [t.name for t in DENSE.tensors] for names in seen)
