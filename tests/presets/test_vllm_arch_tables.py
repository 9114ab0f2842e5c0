"""The ``vllm`` preset on the architectures added for issue 31: DeepSeek-V2 without ``q_lora_rank``
(V2-Lite style: a plain ``q_proj``), Qwen3-Next's gated delta net, Mixtral's experts.

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


def _qwen3_next_linear() -> dict:
    """One Qwen3-Next gated-delta-net layer: 2 key heads and 4 value heads of 128; conv1d channels
    [q (256); k (256); v (512)]; hidden 128."""
    p = "model.layers.0.linear_attn."
    t = [("model.embed_tokens.weight", [128, 128]), ("model.norm.weight", [128]), ("lm_head.weight", [128, 128]),
         (p + "conv1d.weight", [1024, 1, 4]), (p + "in_proj_qkvz.weight", [1536, 128]),
         (p + "in_proj_ba.weight", [8, 128]), (p + "out_proj.weight", [128, 512]), (p + "A_log", [4]),
         (p + "dt_bias", [4]), (p + "norm.weight", [128])]
    return {"tensors": [{"name": n, "shape": s, "dtype": "bfloat16"} for n, s in t],
            "params": {"num_heads": 4, "num_kv_heads": 2, "linear_num_key_heads": 2, "linear_key_head_dim": 128,
                       "linear_num_value_heads": 4, "linear_value_head_dim": 128}}


def test_qwen3_next_conv1d_is_three_slices_of_one_tensor_at_tp2() -> None:
    """vLLM (qwen3_next.py, mamba_v2_sharded_weight_loader): rank r's conv1d = [its q channels; its k
    channels; its v channels]; A_log float32 (bf16 in the checkpoint)."""
    resolved = resolve(_qwen3_next_linear(), rollout={"preset": "vllm", "mesh": {"tp": 2}})
    p = "model.layers.0.linear_attn."
    check_table(resolved.rollout.ranks, {
        p + "conv1d.weight": [
            ((512, 1, 4), ["[0:128, 0:1, 0:4] <- conv1d.weight[0:128, 0:1, 0:4]",
                           "[128:256, 0:1, 0:4] <- conv1d.weight[256:384, 0:1, 0:4]",
                           "[256:512, 0:1, 0:4] <- conv1d.weight[512:768, 0:1, 0:4]"]),
            ((512, 1, 4), ["[0:128, 0:1, 0:4] <- conv1d.weight[128:256, 0:1, 0:4]",
                           "[128:256, 0:1, 0:4] <- conv1d.weight[384:512, 0:1, 0:4]",
                           "[256:512, 0:1, 0:4] <- conv1d.weight[768:1024, 0:1, 0:4]"])],
        p + "A_log": [((2,), ["[0:2] <- A_log[0:2]"]), ((2,), ["[0:2] <- A_log[2:4]"])],
        p + "out_proj.weight": [((128, 256), ["[0:128, 0:256] <- out_proj.weight[0:128, 0:256]"]),
                                ((128, 256), ["[0:128, 0:256] <- out_proj.weight[0:128, 256:512]"])],
    }, strip=p)
    assert resolved.rollout.ranks[0].tensor(p + "A_log").dtype == "float32"
    assert (p + "A_log", "bfloat16") in resolved.rollout.casts  # moved as bf16, widened by the engine


def test_mixtral_experts_under_block_sparse_moe_at_tp2() -> None:
    names = [f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight" for e in range(2) for w in ("w1", "w2", "w3")]
    shapes = {"w1": [64, 32], "w3": [64, 32], "w2": [32, 64]}
    t = [{"name": n, "shape": shapes[n.split(".")[-2]], "dtype": "bfloat16"} for n in names]
    t += [{"name": "model.layers.0.block_sparse_moe.gate.weight", "shape": [2, 32], "dtype": "bfloat16"}]
    ranks = resolve({"tensors": t, "params": {"num_experts": 2}},
                    rollout={"preset": "vllm", "mesh": {"tp": 2}}).rollout.ranks
    e = "model.layers.0.block_sparse_moe.experts."
    check_table(ranks, {e + "routed_experts.w13_weight": [
        ((2, 64, 32), [f"[{i}:{i + 1}, 0:32, 0:32] <- {i}.w1.weight[{r * 32}:{r * 32 + 32}, 0:32]" for i in range(2)]
         + [f"[{i}:{i + 1}, 32:64, 0:32] <- {i}.w3.weight[{r * 32}:{r * 32 + 32}, 0:32]" for i in range(2)])
        for r in range(2)]}, strip=e)
