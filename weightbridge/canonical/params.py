"""Normalised model params, from a HF ``config.json`` dict or from tensor names.

Frame: a raw HF config dict (as ``config.json`` holds it; a nested
``text_config`` is read too) or canonical tensor names/shapes.

Keys produced (only those derivable; ``None`` values are omitted):

``num_layers, hidden_size, num_heads, num_kv_heads, head_dim, vocab_size,
intermediate_size, num_experts, moe_intermediate_size, num_shared_experts,
first_k_dense, tie_word_embeddings, q_lora_rank, kv_lora_rank,
qk_nope_head_dim, qk_rope_head_dim, v_head_dim, linear_num_key_heads, linear_num_value_heads,
linear_key_head_dim, linear_value_head_dim, model_type``

Decisions:

* ``num_experts`` is always present from a config (``0`` for dense models);
  ``moe_intermediate_size``, ``num_shared_experts`` and ``first_k_dense`` only for
  MoE models (``num_experts > 0``).
* ``num_kv_heads`` defaults to ``num_heads``; ``head_dim`` defaults to
  ``hidden_size // num_heads``, except for MLA models (``kv_lora_rank`` set) where
  it is the query/key head dim ``qk_nope_head_dim + qk_rope_head_dim``.
* ``first_k_dense`` is DeepSeek's ``first_k_dense_replace``, or for Qwen-style
  configs the number of leading layers that ``mlp_only_layers`` /
  ``decoder_sparse_step`` make dense.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from weightbridge.layout.ir import CanonicalTensor


_ALIASES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "num_experts": ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "n_experts"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    # Qwen3-Next's gated delta net (linear attention layers)
    "linear_num_key_heads": ("linear_num_key_heads",),
    "linear_num_value_heads": ("linear_num_value_heads",),
    "linear_key_head_dim": ("linear_key_head_dim",),
    "linear_value_head_dim": ("linear_value_head_dim",),
}


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level keys, plus those of a nested ``text_config`` the top level lacks."""
    view = dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        for k, v in text.items():
            if view.get(k) is None:
                view[k] = v
    return view


def _int(view: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    for k in keys:
        v = view.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
    return None


def params_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Normalised params of a raw HF config dict (see module docstring for the keys)."""
    view = _flatten(config)
    out: dict[str, Any] = {}
    for key, aliases in _ALIASES.items():
        v = _int(view, aliases)
        if v is not None:
            out[key] = v
    if "num_heads" in out:
        out.setdefault("num_kv_heads", out["num_heads"])
        if "head_dim" not in out:
            if "kv_lora_rank" in out and "qk_nope_head_dim" in out and "qk_rope_head_dim" in out:
                out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
            elif "hidden_size" in out and out["num_heads"] > 0:
                out["head_dim"] = out["hidden_size"] // out["num_heads"]
    out.setdefault("num_experts", 0)
    if out["num_experts"] > 0:
        _moe_params(view, out)
    else:
        for k in ("moe_intermediate_size", "num_shared_experts"):
            out.pop(k, None)
    tie = view.get("tie_word_embeddings")
    if isinstance(tie, bool):
        out["tie_word_embeddings"] = tie
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        out["model_type"] = model_type
    return out


def _moe_params(view: Mapping[str, Any], out: dict[str, Any]) -> None:
    if "moe_intermediate_size" not in out and "intermediate_size" in out:
        out["moe_intermediate_size"] = out["intermediate_size"]  # Mixtral: experts use intermediate_size
    if "num_shared_experts" not in out:
        shared = _int(view, ("shared_expert_intermediate_size",))
        out["num_shared_experts"] = 1 if shared else 0
    first = _int(view, ("first_k_dense_replace",))
    if first is None and "num_layers" in out:
        first = _leading_dense_layers(view, out["num_layers"])
    if first is not None:
        out["first_k_dense"] = first


def _leading_dense_layers(view: Mapping[str, Any], num_layers: int) -> int:
    """Qwen-MoE convention: layer i is sparse iff i not in mlp_only_layers and (i+1) % step == 0."""
    only = view.get("mlp_only_layers") or []
    step = _int(view, ("decoder_sparse_step",)) or 1
    for i in range(num_layers):
        if i not in only and (i + 1) % step == 0:
            return i
    return num_layers


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_FUSED_EXPERT = re.compile(r"\.experts\.[A-Za-z_]+(?:\.weight)?$")


def params_from_names(tensors: Iterable[CanonicalTensor]) -> dict[str, Any]:
    """Params inferable from canonical tensor names and shapes alone.

    ``num_layers`` (1 + highest ``layers.N``), ``num_experts`` (1 + highest
    ``experts.E``, or dim 0 of a fused ``experts.<proj>`` tensor; ``0`` when no
    expert tensor), ``first_k_dense`` (lowest layer holding experts),
    ``vocab_size``/``hidden_size`` (from ``embed_tokens.weight``) and
    ``tie_word_embeddings`` (an ``embed_tokens.weight`` but no ``lm_head.weight``).
    """
    max_layer = -1
    max_expert = -1
    fused_experts = 0
    expert_layers: list[int] = []
    embed: CanonicalTensor | None = None
    has_lm_head = False
    for t in tensors:
        layer_m = _LAYER.search(t.name)
        if layer_m:
            max_layer = max(max_layer, int(layer_m.group(1)))
        expert_m = _EXPERT.search(t.name)
        fused = expert_m is None and _FUSED_EXPERT.search(t.name) is not None and len(t.shape) >= 2
        if expert_m:
            max_expert = max(max_expert, int(expert_m.group(1)))
        if fused:
            fused_experts = max(fused_experts, t.shape[0])
        if (expert_m or fused) and layer_m:
            expert_layers.append(int(layer_m.group(1)))
        if t.name.endswith("embed_tokens.weight") and len(t.shape) == 2:
            embed = t
        if t.name.endswith("lm_head.weight"):
            has_lm_head = True
    out: dict[str, Any] = {}
    if max_layer >= 0:
        out["num_layers"] = max_layer + 1
    out["num_experts"] = max(max_expert + 1, fused_experts)
    if out["num_experts"] and expert_layers:
        out["first_k_dense"] = min(expert_layers)
    if embed is not None:
        out["vocab_size"], out["hidden_size"] = embed.shape
        out["tie_word_embeddings"] = not has_lm_head
    return out


def merge_params(*layers: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """Later layers win; result sorted by key (the ``CanonicalModel.params`` form)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer:
            merged.update(layer)
    return tuple(sorted(merged.items()))
