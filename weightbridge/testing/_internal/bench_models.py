"""HF configs of generated models for the Gloo benches (``bench/transfer_gloo.py``, ``bench/cluster.py``):
sizes are arguments, so a bench picks how many bytes an update moves. Written to a JSON file, a spec
names it with ``model: {config: PATH}``."""

from __future__ import annotations


def qwen2_config(hidden: int, layers: int, vocab: int, inter: int, heads: int, kv_heads: int) -> dict:
    """A dense Qwen2-style decoder (bf16, untied embeddings)."""
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
        "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "vocab_size": vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": layers,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
    }


def qwen3_moe_config(hidden: int, layers: int, vocab: int, experts: int, moe_inter: int, heads: int,
                     kv_heads: int, head_dim: int) -> dict:
    """A Qwen3-MoE-style decoder: every layer's MLP is ``experts`` experts of ``moe_inter`` (bf16)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": moe_inter * 4, "moe_intermediate_size": moe_inter,
        "num_experts": experts, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 4096, "max_window_layers": layers,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "output_router_logits": False,
        "router_aux_loss_coef": 0.001, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
    }
