"""Quantised targets in the coordinate system (pure core): blocks, scale tensors, specs, plans.

* ``held_blocks`` equals a brute-force element mask (hypothesis: random shapes, blocks, pieces);
* the vLLM TP 2 rollout gets FP8 local tensors and scale tensors with exact boxes;
* a spec is refused (every problem, at ``$.rollout.quantization``) when the engine's local blocks
  are not canonical blocks, or when no trainer rank holds a block whole;
* plans of random dp/tp/round sizes are exact (``validate_plan``), every scale block comes from a
  rank holding it whole, and the wire carries ~50% of the bf16 bytes for the quantised weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fp8_workers as W
from weightbridge.layout.ir import QuantScheme
from weightbridge.layout.quant import VIRTUAL, held_blocks, scale_box, sender_sources
from weightbridge.plan import build_plan, plan_metrics, validate_plan
from weightbridge.plan.network import network_model
from weightbridge.spec.errors import SpecErrors
from weightbridge.spec.resolve import load_spec

BLOCK = QuantScheme()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_held_blocks_are_exactly_the_blocks_inside_the_union(data: st.DataObject) -> None:
    n, k = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40))
    row = data.draw(st.booleans())
    scheme = QuantScheme(kind="row", block=(1, 0)) if row else QuantScheme(
        block=(data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))))
    boxes = []
    for _ in range(data.draw(st.integers(0, 5))):
        a, z = sorted(data.draw(st.tuples(st.integers(0, n), st.integers(0, n))))
        c, d = sorted(data.draw(st.tuples(st.integers(0, k), st.integers(0, k))))
        boxes.append(((a, z), (c, d)))
    mask = np.zeros((n, k), bool)
    for (a, z), (c, d) in boxes:
        mask[a:z, c:d] = True
    bn, bk = (1, k) if row else scheme.block
    want = {(i, j) for i in range(-(-n // bn)) for j in range(-(-k // bk))
            if mask[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].all()}
    got = held_blocks(boxes, (n, k), scheme)
    cover = np.zeros((n, k), int)
    have: set[tuple[int, int]] = set()
    for (a, z), (c, d) in got:
        cover[a:z, c:d] += 1
        (i0, i1), (j0, j1) = scale_box(((a, z), (c, d)), scheme)
        have |= {(i, j) for i in range(i0, i1) for j in range(j0, j1)}
        assert a % bn == 0 and c % bk == 0 and (z % bn == 0 or z == n) and (d % bk == 0 or d == k)
    assert have == want
    assert cover.max(initial=0) <= 1  # disjoint
    assert not (cover.astype(bool) & ~mask).any()  # inside the union


def _spec(tmp_path: Path, **kw) -> str:
    return W.spec_text(W.write_config(tmp_path), **kw)


def test_vllm_tp2_rollout_holds_fp8_weights_and_their_scale_blocks(tmp_path: Path) -> None:
    r = load_spec(_spec(tmp_path))
    rank1 = r.rollout.ranks[1]
    qkv = rank1.tensor("model.layers.0.self_attn.qkv_proj.weight")
    s = rank1.tensor("model.layers.0.self_attn.qkv_proj.weight_scale_inv")
    assert (qkv.shape, qkv.dtype, s.shape, s.dtype) == ((384, 256), "float8_e4m3fn", (3, 2), "float32")
    assert [(p.canonical, p.canonical_box, p.local_box) for p in s.pieces] == [
        ("model.layers.0.self_attn.q_proj.weight_scale_inv", ((1, 2), (0, 2)), ((0, 1), (0, 2))),
        ("model.layers.0.self_attn.k_proj.weight_scale_inv", ((1, 2), (0, 2)), ((1, 2), (0, 2))),
        ("model.layers.0.self_attn.v_proj.weight_scale_inv", ((1, 2), (0, 2)), ((2, 3), (0, 2))),
    ]
    o = rank1.tensor("model.layers.0.self_attn.o_proj.weight_scale_inv")  # row parallel: the second column block
    assert [(p.canonical_box, p.local_box) for p in o.pieces] == [(((0, 2), (1, 2)), ((0, 2), (0, 1)))]
    assert rank1.tensor("model.embed_tokens.weight").dtype == "bfloat16"  # not quantised
    q = {x.weight: x for x in r.rollout.quant}
    assert q["model.layers.0.mlp.down_proj.weight"].source == ("bfloat16",)
    assert r.canonical["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (2, 2)
    sources = sender_sources(r.trainer, r.rollout.quant).ranks[0]
    fp8 = sources.tensor(VIRTUAL + "model.layers.0.self_attn.q_proj.weight")
    assert [p.canonical_box for p in fp8.pieces] == [((0, 128), (0, 256))]  # dp 2: rows 0..127 on rank 0


def test_engine_blocks_off_the_canonical_grid_are_refused_at_the_quantization_path(tmp_path: Path) -> None:
    # 2 heads of 64: at TP 2 each rank's q is 64 rows, its k and v too: local blocks mix q, k and v.
    text = W.spec_text(W.write_config(tmp_path, head_dim=64))
    with pytest.raises(SpecErrors) as exc:
        load_spec(text)
    msgs = [(p.path, p.message) for p in exc.value.problems]
    assert any(path == "$.rollout.quantization" and "off the 128-element block grid" in m and "qkv_proj" in m
               for path, m in msgs), msgs


def test_blocks_no_trainer_rank_holds_whole_are_refused(tmp_path: Path) -> None:
    # dp 3 cuts 256 rows into 86 + 86 + 84: rows 0..127 span ranks 0 and 1.
    with pytest.raises(SpecErrors) as exc:
        load_spec(_spec(tmp_path, dp=3))
    [p] = [p for p in exc.value.problems if p.path == "$.rollout.quantization"]
    assert "blocks no trainer rank holds whole" in p.message and "held as rank 0 [0:86" in p.message
    assert "at: engine" in p.hint
    load_spec(_spec(tmp_path, dp=3, quantization="{block: [128, 128], at: engine}"))  # bf16 on the wire: fine


@pytest.mark.parametrize(("quantization", "path", "text"), [
    ("{weights: ['nothing.*']}", "$.rollout.quantization.weights", "no canonical weight matches"),
    ("{scale_dtype: float8_e8m0fnu}", "$.rollout.quantization.scale_dtype", "powers of two"),
    ("{block: [128]}", "$.rollout.quantization.block", ""),
    ("{at: trainer}", "$.rollout.quantization.at", "not allowed"),
])
def test_malformed_quantization_is_a_located_spec_error(tmp_path: Path, quantization: str, path: str,
                                                        text: str) -> None:
    with pytest.raises(SpecErrors) as exc:
        load_spec(_spec(tmp_path, quantization=quantization))
    assert any(p.path == path and text in p.message for p in exc.value.problems), exc.value.problems


def test_a_prequantized_checkpoint_config_is_understood(tmp_path: Path) -> None:
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}
    cfg = W.write_config(tmp_path, quantization_config=qc)
    text = (f"version: 1\nmodel: {{config: {cfg}}}\ntrainer: {{preset: fsdp2, mesh: {{dp: 2}}, dtype: float32}}\n"
            "rollout: {preset: vllm, mesh: {tp: 2}}\n")
    r = load_spec(text)
    names = {q.weight for q in r.canonical.quant}
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.mlp.down_proj.weight" not in names
    assert r.canonical["model.layers.0.self_attn.q_proj.weight"].dtype == "bfloat16"  # quantised from
    assert r.canonical["model.layers.0.self_attn.q_proj.weight_scale_inv"] == (
        "model.layers.0.self_attn.q_proj.weight_scale_inv", (2, 2), "float32")
    assert r.rollout.ranks[0].tensor("model.layers.0.mlp.down_proj.weight").dtype == "bfloat16"
    with pytest.raises(SpecErrors) as exc:  # the engine loads FP8: it does not quantise
        load_spec(text.replace("mesh: {tp: 2}}", "mesh: {tp: 2}, quantization: {at: engine}}"))
    assert exc.value.problems[0].path == "$.rollout.quantization.at"
    bad = json.loads(cfg.read_text())
    bad["quantization_config"].pop("weight_block_size")
    cfg.write_text(json.dumps(bad))
    with pytest.raises(SpecErrors) as exc:
        load_spec(text)
    assert "per-tensor scales" in exc.value.problems[0].message


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(dp=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]), instances=st.integers(1, 2),
       round_kib=st.sampled_from([16, 64, 1024]))
def test_plans_are_exact_and_fp8_moves_half_the_bytes(tmp_path_factory, dp: int, tp: int, instances: int,
                                                      round_kib: int) -> None:
    d = tmp_path_factory.mktemp("cfg")
    r = load_spec(W.spec_text(W.write_config(d, vocab_size=128), dp=dp, tp=tp, instances=instances,
                              round_bytes=f"{round_kib}KiB"))
    plan = build_plan(r.trainer, r.rollout, round_bytes=round_kib << 10, receiver_dedup="off")
    assert validate_plan(plan, r.trainer, r.rollout, canonical=r.canonical) == []
    quantized = {q.weight for q in r.rollout.quant}
    scales = {q.scale for q in r.rollout.quant}
    for it in plan.items():
        if it.canonical in quantized:
            assert it.dtype == "float8_e4m3fn" and it.src_tensor == VIRTUAL + it.canonical
        elif it.canonical in scales:
            assert it.dtype == "float32" and it.src_tensor == VIRTUAL + it.canonical
    m = plan_metrics(plan, r.trainer, r.rollout, network=network_model("h100"))
    fp8, f32 = m["wire_bytes_by_dtype"]["float8_e4m3fn"], m["wire_bytes_by_dtype"]["float32"]
    assert fp8 * 2 + f32 * 0 == m["unquantized_wire_bytes"] - m["wire_bytes_by_dtype"]["bfloat16"]
    assert abs((fp8 + f32) / (2 * fp8) - 0.5001) < 1e-4  # one fp32 scale per 128x128 block: 50.01%
