"""Every bundled config loads; the big ones match the public parameter counts."""

from __future__ import annotations

import json

import pytest
from transformers_facts import deepseek_router_weight_fp32

from weightbridge.canonical import CanonicalSourceError, bundled_config_path, bundled_names, load_canonical
from weightbridge.canonical.describe import summarize

# name -> (tensor count, exact parameter total we compute, public total, key params)
BIG = {
    "qwen2.5-7b": (339, 7_615_616_512, 7.61e9, {"num_layers": 28, "num_kv_heads": 4, "head_dim": 128}),
    "llama-3.1-8b": (291, 8_030_261_248, 8.03e9, {"num_layers": 32, "num_kv_heads": 8, "vocab_size": 128256}),
    "qwen3-30b-a3b": (18_867, 30_532_122_624, 30.5e9, {"num_experts": 128, "moe_intermediate_size": 768}),
    "qwen3-235b-a22b": (36_945, 235_093_634_560, 235e9, {"num_layers": 94, "moe_intermediate_size": 1536}),
    "deepseek-v3": (
        45_395,
        671_026_419_200,
        671e9,  # without the 14B MTP module
        {"num_experts": 256, "num_shared_experts": 1, "first_k_dense": 3, "kv_lora_rank": 512, "q_lora_rank": 1536},
    ),
}


def test_names() -> None:
    tiny = {"tiny-qwen2", "tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-qwen2-vllm", "tiny-qwen3-moe-vllm"}
    assert set(BIG) | tiny | {"kimi-k2"} == set(bundled_names())
    for name in bundled_names():
        assert json.loads(bundled_config_path(name).read_text())["architectures"]
        assert "quantization_config" not in json.loads(bundled_config_path(name).read_text())


@pytest.mark.parametrize("name", sorted(BIG))
def test_big_bundled(name: str) -> None:
    count, total, public, params = BIG[name]
    m = load_canonical({"bundled": name}, ".")
    s = summarize(m)
    assert len(m) == count
    assert s["totals"]["numel"] == total
    assert abs(total - public) / public < 0.01
    assert params.items() <= m.param_dict.items()
    assert m.param_dict["tie_word_embeddings"] is False and "lm_head.weight" in m
    assert m.source == f"bundled:{name}"


def test_deepseek_v3_layout() -> None:
    m = load_canonical({"bundled": "deepseek-v3"}, ".")
    assert m["model.layers.3.mlp.gate.e_score_correction_bias"].dtype == "float32"
    assert m["model.layers.60.mlp.experts.255.down_proj.weight"].shape == (7168, 2048)
    assert m["model.layers.2.mlp.gate_proj.weight"].shape == (18432, 7168)
    assert m["model.layers.0.self_attn.kv_b_proj.weight"].shape == (128 * (128 + 128), 512)
    assert "model.layers.61.input_layernorm.weight" not in m
    by_dtype = summarize(m)["totals"]["by_dtype"]
    assert set(by_dtype) == {"bfloat16", "float32"}
    # fp32: 58 MoE layers x (bias 256, + router weight 256x7168 where transformers keeps it fp32).
    router = 256 * 7168 if deepseek_router_weight_fp32() else 0
    assert by_dtype["float32"]["numel"] == 58 * (router + 256)


def test_unknown_bundled() -> None:
    with pytest.raises(
        CanonicalSourceError, match=r"model\.bundled: unknown bundled model 'qwen9'.*known: deepseek-v3"
    ):
        load_canonical({"bundled": "qwen9"}, ".")


def test_kimi_k2_is_deepseek_v3_with_384_experts() -> None:
    """bench/peers.py's Kimi-K2 row: the DeepSeek-V3 architecture, 384 experts, one dense layer; the
    model card says "1T total parameters" (rounded), we count 1.026e12 in the bf16 layout."""
    m = load_canonical({"bundled": "kimi-k2"}, ".")
    s = summarize(m)
    assert len(m) == 69_975 and s["totals"]["numel"] == 1_026_408_232_448
    assert {"num_experts": 384, "first_k_dense": 1, "num_layers": 61, "num_heads": 64,
            "vocab_size": 163840}.items() <= m.param_dict.items()
    assert m["model.layers.60.mlp.experts.383.down_proj.weight"].shape == (7168, 2048)
    assert "model.layers.1.mlp.experts.0.up_proj.weight" in m and "model.layers.0.mlp.experts.0.up_proj.weight" not in m
