"""from_hf_config on the tiny bundled configs: exact names, shapes, dtypes, params, cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers_facts import deepseek_router_weight_fp32

from weightbridge.canonical import CanonicalSourceError, bundled_config_path, from_hf_config
from weightbridge.canonical import hf_config as hf_config_mod
from weightbridge.canonical.naming import name_pattern, natural_key

BF = "bfloat16"

TINY_QWEN2 = [
    ("model.embed_tokens.weight", (128, 64), BF),
    ("model.layers.0.input_layernorm.weight", (64,), BF),
    ("model.layers.0.mlp.down_proj.weight", (64, 128), BF),
    ("model.layers.0.mlp.gate_proj.weight", (128, 64), BF),
    ("model.layers.0.mlp.up_proj.weight", (128, 64), BF),
    ("model.layers.0.post_attention_layernorm.weight", (64,), BF),
    ("model.layers.0.self_attn.k_proj.bias", (32,), BF),
    ("model.layers.0.self_attn.k_proj.weight", (32, 64), BF),
    ("model.layers.0.self_attn.o_proj.weight", (64, 64), BF),
    ("model.layers.0.self_attn.q_proj.bias", (64,), BF),
    ("model.layers.0.self_attn.q_proj.weight", (64, 64), BF),
    ("model.layers.0.self_attn.v_proj.bias", (32,), BF),
    ("model.layers.0.self_attn.v_proj.weight", (32, 64), BF),
    ("model.layers.1.input_layernorm.weight", (64,), BF),
    ("model.layers.1.mlp.down_proj.weight", (64, 128), BF),
    ("model.layers.1.mlp.gate_proj.weight", (128, 64), BF),
    ("model.layers.1.mlp.up_proj.weight", (128, 64), BF),
    ("model.layers.1.post_attention_layernorm.weight", (64,), BF),
    ("model.layers.1.self_attn.k_proj.bias", (32,), BF),
    ("model.layers.1.self_attn.k_proj.weight", (32, 64), BF),
    ("model.layers.1.self_attn.o_proj.weight", (64, 64), BF),
    ("model.layers.1.self_attn.q_proj.bias", (64,), BF),
    ("model.layers.1.self_attn.q_proj.weight", (64, 64), BF),
    ("model.layers.1.self_attn.v_proj.bias", (32,), BF),
    ("model.layers.1.self_attn.v_proj.weight", (32, 64), BF),
    ("model.norm.weight", (64,), BF),
]

TINY_QWEN3_MOE = [
    ("lm_head.weight", (128, 64), BF),
    ("model.embed_tokens.weight", (128, 64), BF),
    ("model.layers.0.input_layernorm.weight", (64,), BF),
    ("model.layers.0.mlp.experts.0.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.0.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.0.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.1.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.1.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.1.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.2.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.2.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.2.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.3.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.3.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.3.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.4.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.4.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.4.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.5.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.5.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.5.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.6.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.6.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.6.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.7.down_proj.weight", (64, 32), BF),
    ("model.layers.0.mlp.experts.7.gate_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.experts.7.up_proj.weight", (32, 64), BF),
    ("model.layers.0.mlp.gate.weight", (8, 64), BF),
    ("model.layers.0.post_attention_layernorm.weight", (64,), BF),
    ("model.layers.0.self_attn.k_norm.weight", (16,), BF),
    ("model.layers.0.self_attn.k_proj.weight", (64, 64), BF),
    ("model.layers.0.self_attn.o_proj.weight", (64, 128), BF),
    ("model.layers.0.self_attn.q_norm.weight", (16,), BF),
    ("model.layers.0.self_attn.q_proj.weight", (128, 64), BF),
    ("model.layers.0.self_attn.v_proj.weight", (64, 64), BF),
    ("model.layers.1.input_layernorm.weight", (64,), BF),
    ("model.layers.1.mlp.experts.0.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.0.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.0.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.1.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.1.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.1.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.2.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.2.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.2.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.3.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.3.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.3.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.4.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.4.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.4.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.5.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.5.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.5.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.6.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.6.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.6.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.7.down_proj.weight", (64, 32), BF),
    ("model.layers.1.mlp.experts.7.gate_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.experts.7.up_proj.weight", (32, 64), BF),
    ("model.layers.1.mlp.gate.weight", (8, 64), BF),
    ("model.layers.1.post_attention_layernorm.weight", (64,), BF),
    ("model.layers.1.self_attn.k_norm.weight", (16,), BF),
    ("model.layers.1.self_attn.k_proj.weight", (64, 64), BF),
    ("model.layers.1.self_attn.o_proj.weight", (64, 128), BF),
    ("model.layers.1.self_attn.q_norm.weight", (16,), BF),
    ("model.layers.1.self_attn.q_proj.weight", (128, 64), BF),
    ("model.layers.1.self_attn.v_proj.weight", (64, 64), BF),
    ("model.norm.weight", (64,), BF),
]


def _tiny(name: str):
    return from_hf_config(bundled_config_path(name))


def test_tiny_qwen2_exact() -> None:
    m = _tiny("tiny-qwen2")
    assert [tuple(t) for t in m.tensors] == TINY_QWEN2
    assert m.params == (
        ("head_dim", 8),
        ("hidden_size", 64),
        ("intermediate_size", 128),
        ("model_type", "qwen2"),
        ("num_experts", 0),
        ("num_heads", 8),
        ("num_kv_heads", 4),
        ("num_layers", 2),
        ("tie_word_embeddings", True),
        ("vocab_size", 128),
    )


def test_tiny_qwen3_moe_exact() -> None:
    m = _tiny("tiny-qwen3-moe")
    assert [tuple(t) for t in m.tensors] == TINY_QWEN3_MOE
    p = m.param_dict
    assert p["num_experts"] == 8 and p["moe_intermediate_size"] == 32
    assert p["num_shared_experts"] == 0 and p["first_k_dense"] == 0
    assert p["head_dim"] == 16 and p["num_kv_heads"] == 4
    # No transformers-v5 fused runtime names leak into the canonical frame.
    assert not any(t.name.endswith(("gate_up_proj", "experts.down_proj")) for t in m.tensors)


def test_tied_vs_untied_lm_head() -> None:
    tied = _tiny("tiny-qwen2")
    assert "lm_head.weight" not in tied and tied.param_dict["tie_word_embeddings"] is True
    raw = json.loads(bundled_config_path("tiny-qwen2").read_text())
    untied = from_hf_config({**raw, "tie_word_embeddings": False})
    assert untied["lm_head.weight"] == ("lm_head.weight", (128, 64), BF)
    assert len(untied) == len(tied) + 1 and untied.param_dict["tie_word_embeddings"] is False
    llama = _tiny("tiny-llama")
    assert llama["lm_head.weight"].shape == (256, 128)
    assert llama.param_dict["tie_word_embeddings"] is False


def test_tiny_llama_shapes() -> None:
    m = _tiny("tiny-llama")
    assert len(m) == 2 * 9 + 3
    assert m["model.layers.1.self_attn.q_proj.weight"].shape == (128, 128)
    assert m["model.layers.1.self_attn.k_proj.weight"].shape == (64, 128)
    assert m["model.layers.1.mlp.down_proj.weight"].shape == (128, 256)
    assert not any(t.name.endswith(".bias") for t in m.tensors)


def test_deepseek_fp32_router_and_mla() -> None:
    m = _tiny("tiny-deepseek-v3")
    assert m["model.layers.1.mlp.gate.e_score_correction_bias"] == (
        "model.layers.1.mlp.gate.e_score_correction_bias",
        (8,),
        "float32",
    )
    # transformers >= 5.2x keeps the router weight in fp32 too (_keep_in_fp32_modules_strict).
    assert m["model.layers.1.mlp.gate.weight"].dtype == ("float32" if deepseek_router_weight_fp32() else "bfloat16")
    assert "model.layers.0.mlp.gate.weight" not in m  # first_k_dense_replace = 1
    assert m["model.layers.0.mlp.gate_proj.weight"].shape == (128, 64)
    assert m["model.layers.2.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert m["model.layers.2.mlp.shared_experts.gate_proj.weight"].shape == (32, 64)
    assert m["model.layers.0.self_attn.q_b_proj.weight"].shape == (8 * (16 + 8), 32)
    assert m["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape == (16 + 8, 64)
    assert m["model.layers.0.self_attn.kv_b_proj.weight"].shape == (8 * (16 + 16), 16)
    assert m["model.layers.0.self_attn.o_proj.weight"].shape == (64, 8 * 16)
    assert not any(".layers.3." in t.name for t in m.tensors)  # no MTP layer
    assert {t.dtype for t in m.tensors if "gate." not in t.name} == {BF}
    p = m.param_dict
    assert (p["num_experts"], p["num_shared_experts"], p["first_k_dense"]) == (8, 1, 1)
    assert (p["q_lora_rank"], p["kv_lora_rank"], p["v_head_dim"]) == (32, 16, 16)
    assert (p["qk_nope_head_dim"], p["qk_rope_head_dim"], p["head_dim"]) == (16, 8, 24)
    assert p["num_layers"] == 3 and p["model_type"] == "deepseek_v3"


def test_dtype_override_keeps_forced_fp32() -> None:
    m = from_hf_config(bundled_config_path("tiny-deepseek-v3"), dtype="fp16")
    assert m["model.embed_tokens.weight"].dtype == "float16"
    assert m["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == "float32"
    with pytest.raises(CanonicalSourceError, match="dtype"):
        from_hf_config(bundled_config_path("tiny-qwen2"), dtype="int8")


def test_natural_order_and_patterns() -> None:
    names = ["model.layers.10.a", "model.layers.2.a", "model.layers.1.b", "lm_head.weight"]
    assert sorted(names, key=natural_key) == [
        "lm_head.weight",
        "model.layers.1.b",
        "model.layers.2.a",
        "model.layers.10.a",
    ]
    assert (
        name_pattern("model.layers.3.mlp.experts.17.gate_proj.weight")
        == "model.layers.*.mlp.experts.*.gate_proj.weight"
    )
    raw = json.loads(bundled_config_path("tiny-qwen2").read_text())
    m = from_hf_config({**raw, "num_hidden_layers": 12}, use_cache=False)
    layer_order = [int(t.name.split(".")[2]) for t in m.tensors if t.name.startswith("model.layers.")]
    assert layer_order == sorted(layer_order)


def test_cache_written_then_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = bundled_config_path("tiny-qwen3-moe")
    cold = from_hf_config(cfg, cache_dir=tmp_path)
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1 and not list(tmp_path.glob(".tmp-*"))

    def boom(*args: object) -> None:
        raise AssertionError("cache miss")

    monkeypatch.setattr(hf_config_mod, "_instantiate", boom)
    assert from_hf_config(cfg, cache_dir=tmp_path) == cold
    entries[0].write_text("{not json")  # a corrupt entry is recomputed, not trusted
    with pytest.raises(AssertionError, match="cache miss"):
        from_hf_config(cfg, cache_dir=tmp_path)


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(CanonicalSourceError, match="no such file") as err:
        from_hf_config(tmp_path / "missing.json")
    assert err.value.key == "config"
    with pytest.raises(CanonicalSourceError, match="no config.json"):
        from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2")
    with pytest.raises(CanonicalSourceError, match="JSON"):
        from_hf_config(tmp_path)
    with pytest.raises(CanonicalSourceError, match="unknown to transformers"):
        from_hf_config({"model_type": "no-such-arch"}, use_cache=False)
