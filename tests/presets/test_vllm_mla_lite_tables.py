"""The ``vllm`` preset on DeepSeek-V2 without ``q_lora_rank`` (V2-Lite style: a plain ``q_proj``).

From vllm-project/vllm ``model_executor/models/deepseek_v2.py`` (0.32): with ``q_lora_rank`` None,
``DeepseekV2MLAAttention`` builds ``q_proj = ColumnParallelLinear(hidden, num_heads * qk_head_dim)``,
so each TP rank holds the rows of its heads (``num_heads // tp`` heads of ``qk_nope + qk_rope``
rows each); ``kv_a_proj_with_mqa`` is a ReplicatedLinear (no ``fused_qkv_a_proj`` without a q
LoRA). Checked end to end by the architecture zoo's ``deepseek-v2`` case at TP 2. Tables by hand:
4 heads of 32 + 64 = 96 rows, hidden 64, kv_lora_rank 512 + rope 64.
"""

from __future__ import annotations

from preset_helpers import check_table, resolve


def _mla_lite() -> dict:
    p = "model.layers.0.self_attn."
    t = [("model.embed_tokens.weight", [128, 64]), ("model.norm.weight", [64]), ("lm_head.weight", [128, 64]),
         ("model.layers.0.input_layernorm.weight", [64]), ("model.layers.0.post_attention_layernorm.weight", [64]),
         (p + "q_proj.weight", [384, 64]), (p + "kv_a_proj_with_mqa.weight", [576, 64]),
         (p + "kv_a_layernorm.weight", [512]), (p + "kv_b_proj.weight", [256, 512]), (p + "o_proj.weight", [64, 128]),
         ("model.layers.0.mlp.gate_proj.weight", [128, 64]), ("model.layers.0.mlp.up_proj.weight", [128, 64]),
         ("model.layers.0.mlp.down_proj.weight", [64, 128])]
    return {"tensors": [{"name": n, "shape": s, "dtype": "bfloat16"} for n, s in t],
            "params": {"num_heads": 4, "num_kv_heads": 4, "kv_lora_rank": 512}}


def test_q_proj_without_q_lora_is_split_by_heads_at_tp2() -> None:
    ranks = resolve(_mla_lite(), rollout={"preset": "vllm", "mesh": {"tp": 2}}).rollout.ranks
    p = "model.layers.0.self_attn."
    check_table(ranks, {
        p + "q_proj.weight": [((192, 64), ["[0:192, 0:64] <- q_proj.weight[0:192, 0:64]"]),
                              ((192, 64), ["[0:192, 0:64] <- q_proj.weight[192:384, 0:64]"])],
        p + "kv_a_proj_with_mqa.weight": [((576, 64), ["[0:576, 0:64] <- kv_a_proj_with_mqa.weight[0:576, 0:64]"])] * 2,
        p + "kv_b_proj.weight": [((128, 512), ["[0:128, 0:512] <- kv_b_proj.weight[0:128, 0:512]"]),
                                 ((128, 512), ["[0:128, 0:512] <- kv_b_proj.weight[128:256, 0:512]"])],
    }, strip=p)


def test_a_plain_q_proj_of_a_gqa_model_stays_in_qkv_proj() -> None:
    from preset_helpers import qwen2

    ranks = resolve(qwen2(), rollout={"preset": "vllm", "mesh": {"tp": 2}}).rollout.ranks
    assert not any(t.name.endswith("q_proj.weight") for t in ranks[0].tensors)
