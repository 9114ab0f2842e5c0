"""The ``vllm`` preset against what vLLM's own layers hold per TP rank.

Every expected value below is a literal table (local shape; ``local box <-
canonical[box]`` per piece), worked out by hand from vLLM's loaders, not from the
preset's rule formulas. Boxes are ``[start:stop, ...]`` per dim; names of layer
tensors are relative to ``model.layers.<L>.``.

Derived from (vllm-project/vllm, read for these tables):

* ``vllm/model_executor/layers/linear.py``: ``QKVParallelLinear.__init__``
  (``num_heads = total // tp``; when ``tp >= total_num_kv_heads``: one kv head per
  rank and ``num_kv_head_replicas = tp // total_num_kv_heads``; output sizes
  [q; k; v]), ``QKVParallelLinear.weight_loader`` (q at offset 0, k at
  ``num_heads*head_size``, v after k; ``shard_rank = tp_rank`` for q and
  ``tp_rank // num_kv_head_replicas`` for k/v), ``MergedColumnParallelLinear.weight_loader``
  (``shard_offset = sum(output_sizes[:shard_id]) // tp``, loaded rows
  ``tp_rank*shard_size``), ``ColumnParallelLinear`` (bias sharded like rows),
  ``RowParallelLinear`` (``input_size_per_partition``, dim 1).
* ``vllm/model_executor/parameter.py``: ``_ColumnvLLMParameter.load_qkv_weight``
  (``shard_id_int = tp_rank if q else tp_rank // num_heads``),
  ``load_merged_column_weight``, ``RowvLLMParameter.load_row_parallel_weight``.
* ``vllm/model_executor/layers/vocab_parallel_embedding.py``:
  ``DEFAULT_VOCAB_PADDING_SIZE = 64``, ``pad_vocab_size``,
  ``VocabParallelEmbedding._get_indices`` (padded vocab split evenly over tp, real
  rows ``min(start, vocab)..min(end, vocab)``), ``VocabParallelEmbedding.weight_loader``
  (rows past the real vocabulary are zero padding); ``ParallelLMHead`` is the same.
* ``vllm/model_executor/models/qwen2.py``: ``Qwen2Attention`` (qkv_proj bias=True,
  o_proj no bias), ``Qwen2MLP`` (gate_up_proj = MergedColumnParallelLinear
  ``[intermediate]*2``), ``Qwen2Model.__init__`` (embed_tokens on the first PP rank
  *or* on the last when ``tie_word_embeddings``), ``Qwen2ForCausalLM.__init__``
  (``lm_head = model.embed_tokens`` when tied) and ``load_weights``
  (``skip_prefixes=["lm_head."]`` when tied).
* ``vllm/model_executor/layers/fused_moe/layer.py``:
  ``UnquantizedFusedMoEMethod.create_weights`` (w13 ``[E_local, 2*I_per_partition, H]``,
  w2 ``[E_local, H, I_per_partition]``), ``FusedMoE.__init__`` (with
  ``enable_expert_parallel``: ``ep_size = tp*dp``, ``ep_rank = tp_rank``, moe
  ``tp_size = 1``), ``determine_expert_map`` (default "linear": contiguous experts),
  ``FusedMoE._load_w13`` (w1/gate into the first half, w3/up into the second, each
  narrowed at ``shard_size*tp_rank``), ``FusedMoE._load_w2`` (dim 1).
* ``vllm/model_executor/models/deepseek_v2.py``: ``DeepseekV2MLAAttention.__init__``
  (``fused_qkv_a_proj = MergedColumnParallelLinear([q_lora_rank, kv_lora_rank +
  qk_rope_head_dim], disable_tp=True)``; ``q_b_proj`` / ``kv_b_proj``
  ColumnParallelLinear; ``o_proj`` RowParallelLinear over ``num_heads*v_head_dim``),
  ``DeepseekV2MoE.__init__`` (``gate.e_score_correction_bias`` float32;
  ``shared_experts = DeepseekV2MLP(moe_intermediate_size * n_shared_experts)``,
  TP-sharded), ``DeepSeekV2Gate`` (a ReplicatedLinear in the default = model dtype).
"""

from __future__ import annotations

import re

import pytest

from preset_helpers import qwen2, tensor_names, view
from preset_helpers import resolve as _resolve_any


def _resolve(model: dict, rollout: dict, trainer: dict | None = None):
    return _resolve_any(model, trainer=trainer, rollout=rollout)


# ---- helpers (restructure only; no sharding arithmetic) ------------------------------------


def _expect(entry) -> tuple[tuple[int, ...], list[str]]:
    shape, pieces = entry
    return tuple(shape), sorted(pieces)


def _check_table(ranks, table: dict, layer: int | None = 0) -> None:
    prefix = f"model.layers.{layer}." if layer is not None else ""
    for local, per_rank in table.items():
        full = local if local.startswith(("model.embed_tokens", "lm_head", "model.norm")) else prefix + local
        assert len(per_rank) == len(ranks), local
        for r, (rank, entry) in enumerate(zip(ranks, per_rank)):
            assert full in tensor_names(rank), f"rank {rank.rank} holds no {full}; it holds {sorted(tensor_names(rank))}"
            assert view(rank, full, prefix) == _expect(entry), f"{full} on rank {rank.rank}"


# ---- dense Qwen2-style: qkv / o / gate_up / down / embed / lm_head per TP rank ------------------
# q: 8 heads x 8 = 64 rows; k, v: 2 heads x 8 = 16 rows; intermediate 96; vocab 100 padded to 128
# (a multiple of 64) and split evenly over tp. At tp 8 > 2 kv heads each rank holds one kv head,
# head tp_rank // 4: head 0 replicated on ranks 0-3, head 1 on ranks 4-7.
VLLM_QWEN2 = {
    1: {
        "self_attn.qkv_proj.weight": [
            ((96, 64), [  # rank 0
                "[0:64, 0:64] <- self_attn.q_proj.weight[0:64, 0:64]",
                "[64:80, 0:64] <- self_attn.k_proj.weight[0:16, 0:64]",
                "[80:96, 0:64] <- self_attn.v_proj.weight[0:16, 0:64]",
            ]),
        ],
        "self_attn.qkv_proj.bias": [
            ((96,), [  # rank 0
                "[0:64] <- self_attn.q_proj.bias[0:64]",
                "[64:80] <- self_attn.k_proj.bias[0:16]",
                "[80:96] <- self_attn.v_proj.bias[0:16]",
            ]),
        ],
        "self_attn.o_proj.weight": [
            ((64, 64), [  # rank 0
                "[0:64, 0:64] <- self_attn.o_proj.weight[0:64, 0:64]",
            ]),
        ],
        "mlp.gate_up_proj.weight": [
            ((192, 64), [  # rank 0
                "[0:96, 0:64] <- mlp.gate_proj.weight[0:96, 0:64]",
                "[96:192, 0:64] <- mlp.up_proj.weight[0:96, 0:64]",
            ]),
        ],
        "mlp.down_proj.weight": [
            ((64, 96), [  # rank 0
                "[0:64, 0:96] <- mlp.down_proj.weight[0:64, 0:96]",
            ]),
        ],
        "model.embed_tokens.weight": [
            ((128, 64), [  # rank 0
                "[0:100, 0:64] <- model.embed_tokens.weight[0:100, 0:64]",
            ]),
        ],
        "lm_head.weight": [
            ((128, 64), [  # rank 0
                "[0:100, 0:64] <- lm_head.weight[0:100, 0:64]",
            ]),
        ],
    },
    2: {
        "self_attn.qkv_proj.weight": [
            ((48, 64), [  # rank 0
                "[0:32, 0:64] <- self_attn.q_proj.weight[0:32, 0:64]",
                "[32:40, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[40:48, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((48, 64), [  # rank 1
                "[0:32, 0:64] <- self_attn.q_proj.weight[32:64, 0:64]",
                "[32:40, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[40:48, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
        ],
        "self_attn.qkv_proj.bias": [
            ((48,), [  # rank 0
                "[0:32] <- self_attn.q_proj.bias[0:32]",
                "[32:40] <- self_attn.k_proj.bias[0:8]",
                "[40:48] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((48,), [  # rank 1
                "[0:32] <- self_attn.q_proj.bias[32:64]",
                "[32:40] <- self_attn.k_proj.bias[8:16]",
                "[40:48] <- self_attn.v_proj.bias[8:16]",
            ]),
        ],
        "self_attn.o_proj.weight": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- self_attn.o_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- self_attn.o_proj.weight[0:64, 32:64]",
            ]),
        ],
        "mlp.gate_up_proj.weight": [
            ((96, 64), [  # rank 0
                "[0:48, 0:64] <- mlp.gate_proj.weight[0:48, 0:64]",
                "[48:96, 0:64] <- mlp.up_proj.weight[0:48, 0:64]",
            ]),
            ((96, 64), [  # rank 1
                "[0:48, 0:64] <- mlp.gate_proj.weight[48:96, 0:64]",
                "[48:96, 0:64] <- mlp.up_proj.weight[48:96, 0:64]",
            ]),
        ],
        "mlp.down_proj.weight": [
            ((64, 48), [  # rank 0
                "[0:64, 0:48] <- mlp.down_proj.weight[0:64, 0:48]",
            ]),
            ((64, 48), [  # rank 1
                "[0:64, 0:48] <- mlp.down_proj.weight[0:64, 48:96]",
            ]),
        ],
        "model.embed_tokens.weight": [
            ((64, 64), [  # rank 0
                "[0:64, 0:64] <- model.embed_tokens.weight[0:64, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:36, 0:64] <- model.embed_tokens.weight[64:100, 0:64]",
            ]),
        ],
        "lm_head.weight": [
            ((64, 64), [  # rank 0
                "[0:64, 0:64] <- lm_head.weight[0:64, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:36, 0:64] <- lm_head.weight[64:100, 0:64]",
            ]),
        ],
    },
    4: {
        "self_attn.qkv_proj.weight": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- self_attn.q_proj.weight[0:16, 0:64]",
                "[16:24, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[24:32, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- self_attn.q_proj.weight[16:32, 0:64]",
                "[16:24, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[24:32, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((32, 64), [  # rank 2
                "[0:16, 0:64] <- self_attn.q_proj.weight[32:48, 0:64]",
                "[16:24, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[24:32, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
            ((32, 64), [  # rank 3
                "[0:16, 0:64] <- self_attn.q_proj.weight[48:64, 0:64]",
                "[16:24, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[24:32, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
        ],
        "self_attn.qkv_proj.bias": [
            ((32,), [  # rank 0
                "[0:16] <- self_attn.q_proj.bias[0:16]",
                "[16:24] <- self_attn.k_proj.bias[0:8]",
                "[24:32] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((32,), [  # rank 1
                "[0:16] <- self_attn.q_proj.bias[16:32]",
                "[16:24] <- self_attn.k_proj.bias[0:8]",
                "[24:32] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((32,), [  # rank 2
                "[0:16] <- self_attn.q_proj.bias[32:48]",
                "[16:24] <- self_attn.k_proj.bias[8:16]",
                "[24:32] <- self_attn.v_proj.bias[8:16]",
            ]),
            ((32,), [  # rank 3
                "[0:16] <- self_attn.q_proj.bias[48:64]",
                "[16:24] <- self_attn.k_proj.bias[8:16]",
                "[24:32] <- self_attn.v_proj.bias[8:16]",
            ]),
        ],
        "self_attn.o_proj.weight": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- self_attn.o_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- self_attn.o_proj.weight[0:64, 16:32]",
            ]),
            ((64, 16), [  # rank 2
                "[0:64, 0:16] <- self_attn.o_proj.weight[0:64, 32:48]",
            ]),
            ((64, 16), [  # rank 3
                "[0:64, 0:16] <- self_attn.o_proj.weight[0:64, 48:64]",
            ]),
        ],
        "mlp.gate_up_proj.weight": [
            ((48, 64), [  # rank 0
                "[0:24, 0:64] <- mlp.gate_proj.weight[0:24, 0:64]",
                "[24:48, 0:64] <- mlp.up_proj.weight[0:24, 0:64]",
            ]),
            ((48, 64), [  # rank 1
                "[0:24, 0:64] <- mlp.gate_proj.weight[24:48, 0:64]",
                "[24:48, 0:64] <- mlp.up_proj.weight[24:48, 0:64]",
            ]),
            ((48, 64), [  # rank 2
                "[0:24, 0:64] <- mlp.gate_proj.weight[48:72, 0:64]",
                "[24:48, 0:64] <- mlp.up_proj.weight[48:72, 0:64]",
            ]),
            ((48, 64), [  # rank 3
                "[0:24, 0:64] <- mlp.gate_proj.weight[72:96, 0:64]",
                "[24:48, 0:64] <- mlp.up_proj.weight[72:96, 0:64]",
            ]),
        ],
        "mlp.down_proj.weight": [
            ((64, 24), [  # rank 0
                "[0:64, 0:24] <- mlp.down_proj.weight[0:64, 0:24]",
            ]),
            ((64, 24), [  # rank 1
                "[0:64, 0:24] <- mlp.down_proj.weight[0:64, 24:48]",
            ]),
            ((64, 24), [  # rank 2
                "[0:64, 0:24] <- mlp.down_proj.weight[0:64, 48:72]",
            ]),
            ((64, 24), [  # rank 3
                "[0:64, 0:24] <- mlp.down_proj.weight[0:64, 72:96]",
            ]),
        ],
        "model.embed_tokens.weight": [
            ((32, 64), [  # rank 0
                "[0:32, 0:64] <- model.embed_tokens.weight[0:32, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:32, 0:64] <- model.embed_tokens.weight[32:64, 0:64]",
            ]),
            ((32, 64), [  # rank 2
                "[0:32, 0:64] <- model.embed_tokens.weight[64:96, 0:64]",
            ]),
            ((32, 64), [  # rank 3
                "[0:4, 0:64] <- model.embed_tokens.weight[96:100, 0:64]",
            ]),
        ],
        "lm_head.weight": [
            ((32, 64), [  # rank 0
                "[0:32, 0:64] <- lm_head.weight[0:32, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:32, 0:64] <- lm_head.weight[32:64, 0:64]",
            ]),
            ((32, 64), [  # rank 2
                "[0:32, 0:64] <- lm_head.weight[64:96, 0:64]",
            ]),
            ((32, 64), [  # rank 3
                "[0:4, 0:64] <- lm_head.weight[96:100, 0:64]",
            ]),
        ],
    },
    8: {
        "self_attn.qkv_proj.weight": [
            ((24, 64), [  # rank 0
                "[0:8, 0:64] <- self_attn.q_proj.weight[0:8, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((24, 64), [  # rank 1
                "[0:8, 0:64] <- self_attn.q_proj.weight[8:16, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((24, 64), [  # rank 2
                "[0:8, 0:64] <- self_attn.q_proj.weight[16:24, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((24, 64), [  # rank 3
                "[0:8, 0:64] <- self_attn.q_proj.weight[24:32, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
            ]),
            ((24, 64), [  # rank 4
                "[0:8, 0:64] <- self_attn.q_proj.weight[32:40, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
            ((24, 64), [  # rank 5
                "[0:8, 0:64] <- self_attn.q_proj.weight[40:48, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
            ((24, 64), [  # rank 6
                "[0:8, 0:64] <- self_attn.q_proj.weight[48:56, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
            ((24, 64), [  # rank 7
                "[0:8, 0:64] <- self_attn.q_proj.weight[56:64, 0:64]",
                "[8:16, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[16:24, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
        ],
        "self_attn.qkv_proj.bias": [
            ((24,), [  # rank 0
                "[0:8] <- self_attn.q_proj.bias[0:8]",
                "[8:16] <- self_attn.k_proj.bias[0:8]",
                "[16:24] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((24,), [  # rank 1
                "[0:8] <- self_attn.q_proj.bias[8:16]",
                "[8:16] <- self_attn.k_proj.bias[0:8]",
                "[16:24] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((24,), [  # rank 2
                "[0:8] <- self_attn.q_proj.bias[16:24]",
                "[8:16] <- self_attn.k_proj.bias[0:8]",
                "[16:24] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((24,), [  # rank 3
                "[0:8] <- self_attn.q_proj.bias[24:32]",
                "[8:16] <- self_attn.k_proj.bias[0:8]",
                "[16:24] <- self_attn.v_proj.bias[0:8]",
            ]),
            ((24,), [  # rank 4
                "[0:8] <- self_attn.q_proj.bias[32:40]",
                "[8:16] <- self_attn.k_proj.bias[8:16]",
                "[16:24] <- self_attn.v_proj.bias[8:16]",
            ]),
            ((24,), [  # rank 5
                "[0:8] <- self_attn.q_proj.bias[40:48]",
                "[8:16] <- self_attn.k_proj.bias[8:16]",
                "[16:24] <- self_attn.v_proj.bias[8:16]",
            ]),
            ((24,), [  # rank 6
                "[0:8] <- self_attn.q_proj.bias[48:56]",
                "[8:16] <- self_attn.k_proj.bias[8:16]",
                "[16:24] <- self_attn.v_proj.bias[8:16]",
            ]),
            ((24,), [  # rank 7
                "[0:8] <- self_attn.q_proj.bias[56:64]",
                "[8:16] <- self_attn.k_proj.bias[8:16]",
                "[16:24] <- self_attn.v_proj.bias[8:16]",
            ]),
        ],
        "self_attn.o_proj.weight": [
            ((64, 8), [  # rank 0
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 0:8]",
            ]),
            ((64, 8), [  # rank 1
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 8:16]",
            ]),
            ((64, 8), [  # rank 2
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 16:24]",
            ]),
            ((64, 8), [  # rank 3
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 24:32]",
            ]),
            ((64, 8), [  # rank 4
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 32:40]",
            ]),
            ((64, 8), [  # rank 5
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 40:48]",
            ]),
            ((64, 8), [  # rank 6
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 48:56]",
            ]),
            ((64, 8), [  # rank 7
                "[0:64, 0:8] <- self_attn.o_proj.weight[0:64, 56:64]",
            ]),
        ],
        "mlp.gate_up_proj.weight": [
            ((24, 64), [  # rank 0
                "[0:12, 0:64] <- mlp.gate_proj.weight[0:12, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[0:12, 0:64]",
            ]),
            ((24, 64), [  # rank 1
                "[0:12, 0:64] <- mlp.gate_proj.weight[12:24, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[12:24, 0:64]",
            ]),
            ((24, 64), [  # rank 2
                "[0:12, 0:64] <- mlp.gate_proj.weight[24:36, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[24:36, 0:64]",
            ]),
            ((24, 64), [  # rank 3
                "[0:12, 0:64] <- mlp.gate_proj.weight[36:48, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[36:48, 0:64]",
            ]),
            ((24, 64), [  # rank 4
                "[0:12, 0:64] <- mlp.gate_proj.weight[48:60, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[48:60, 0:64]",
            ]),
            ((24, 64), [  # rank 5
                "[0:12, 0:64] <- mlp.gate_proj.weight[60:72, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[60:72, 0:64]",
            ]),
            ((24, 64), [  # rank 6
                "[0:12, 0:64] <- mlp.gate_proj.weight[72:84, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[72:84, 0:64]",
            ]),
            ((24, 64), [  # rank 7
                "[0:12, 0:64] <- mlp.gate_proj.weight[84:96, 0:64]",
                "[12:24, 0:64] <- mlp.up_proj.weight[84:96, 0:64]",
            ]),
        ],
        "mlp.down_proj.weight": [
            ((64, 12), [  # rank 0
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 0:12]",
            ]),
            ((64, 12), [  # rank 1
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 12:24]",
            ]),
            ((64, 12), [  # rank 2
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 24:36]",
            ]),
            ((64, 12), [  # rank 3
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 36:48]",
            ]),
            ((64, 12), [  # rank 4
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 48:60]",
            ]),
            ((64, 12), [  # rank 5
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 60:72]",
            ]),
            ((64, 12), [  # rank 6
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 72:84]",
            ]),
            ((64, 12), [  # rank 7
                "[0:64, 0:12] <- mlp.down_proj.weight[0:64, 84:96]",
            ]),
        ],
        "model.embed_tokens.weight": [
            ((16, 64), [  # rank 0
                "[0:16, 0:64] <- model.embed_tokens.weight[0:16, 0:64]",
            ]),
            ((16, 64), [  # rank 1
                "[0:16, 0:64] <- model.embed_tokens.weight[16:32, 0:64]",
            ]),
            ((16, 64), [  # rank 2
                "[0:16, 0:64] <- model.embed_tokens.weight[32:48, 0:64]",
            ]),
            ((16, 64), [  # rank 3
                "[0:16, 0:64] <- model.embed_tokens.weight[48:64, 0:64]",
            ]),
            ((16, 64), [  # rank 4
                "[0:16, 0:64] <- model.embed_tokens.weight[64:80, 0:64]",
            ]),
            ((16, 64), [  # rank 5
                "[0:16, 0:64] <- model.embed_tokens.weight[80:96, 0:64]",
            ]),
            ((16, 64), [  # rank 6
                "[0:4, 0:64] <- model.embed_tokens.weight[96:100, 0:64]",
            ]),
            ((16, 64), []),  # rank 7: padding only
        ],
        "lm_head.weight": [
            ((16, 64), [  # rank 0
                "[0:16, 0:64] <- lm_head.weight[0:16, 0:64]",
            ]),
            ((16, 64), [  # rank 1
                "[0:16, 0:64] <- lm_head.weight[16:32, 0:64]",
            ]),
            ((16, 64), [  # rank 2
                "[0:16, 0:64] <- lm_head.weight[32:48, 0:64]",
            ]),
            ((16, 64), [  # rank 3
                "[0:16, 0:64] <- lm_head.weight[48:64, 0:64]",
            ]),
            ((16, 64), [  # rank 4
                "[0:16, 0:64] <- lm_head.weight[64:80, 0:64]",
            ]),
            ((16, 64), [  # rank 5
                "[0:16, 0:64] <- lm_head.weight[80:96, 0:64]",
            ]),
            ((16, 64), [  # rank 6
                "[0:4, 0:64] <- lm_head.weight[96:100, 0:64]",
            ]),
            ((16, 64), []),  # rank 7: padding only
        ],
    },
}

# vocab 130 at tp 2: padded to 192, 96 rows per rank; the last rank holds 34 real rows + 62 padding.
VLLM_VOCAB_130_TP2 = {
    "model.embed_tokens.weight": [
        ((96, 64), [  # rank 0
            "[0:96, 0:64] <- model.embed_tokens.weight[0:96, 0:64]",
        ]),
        ((96, 64), [  # rank 1
            "[0:34, 0:64] <- model.embed_tokens.weight[96:130, 0:64]",
        ]),
    ],
    "lm_head.weight": [
        ((96, 64), [  # rank 0
            "[0:96, 0:64] <- lm_head.weight[0:96, 0:64]",
        ]),
        ((96, 64), [  # rank 1
            "[0:34, 0:64] <- lm_head.weight[96:130, 0:64]",
        ]),
    ],
}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_vllm_qwen2_tables(tp: int) -> None:
    resolved = _resolve(qwen2(), {"preset": "vllm", "mesh": {"tp": tp}})
    ranks = resolved.rollout.ranks
    assert [dict(r.coords)["tp"] for r in ranks] == list(range(tp))  # vLLM: rank = tp rank (pp 1)
    _check_table(ranks, VLLM_QWEN2[tp])


def test_vllm_vocab_padding_last_rank_partly_real() -> None:
    resolved = _resolve(qwen2(vocab=130), {"preset": "vllm", "mesh": {"tp": 2}})
    _check_table(resolved.rollout.ranks, VLLM_VOCAB_130_TP2, layer=None)


def test_vllm_tied_embeddings_have_no_lm_head() -> None:
    # Qwen2ForCausalLM: lm_head *is* model.embed_tokens when tied; load_weights skips "lm_head.".
    resolved = _resolve(qwen2(tied=True), {"preset": "vllm", "mesh": {"tp": 2}})
    for rank in resolved.rollout.ranks:
        assert not any(n.startswith("lm_head") for n in tensor_names(rank)), sorted(tensor_names(rank))
    _check_table(
        resolved.rollout.ranks, {"model.embed_tokens.weight": VLLM_QWEN2[2]["model.embed_tokens.weight"]}, layer=None
    )


def test_vllm_tied_embeddings_pp2_last_stage_holds_embed_tokens() -> None:
    # Qwen2Model.__init__: embed_tokens exists on the first PP rank *or* (tie_word_embeddings and the
    # last PP rank), and lm_head = model.embed_tokens there; so with tied embeddings the last stage
    # holds model.embed_tokens.weight too (padded to 128, whole at tp 1), loaded from the checkpoint.
    resolved = _resolve(qwen2(tied=True, layers=2), {"preset": "vllm", "mesh": {"tp": 1, "pp": 2}})
    first, last = resolved.rollout.ranks
    assert dict(first.coords)["pp"] == 0 and dict(last.coords)["pp"] == 1
    expected = {
        "model.embed_tokens.weight": [
            ((128, 64), [  # the one rank of the stage
                "[0:100, 0:64] <- model.embed_tokens.weight[0:100, 0:64]",
            ]),
        ],
    }
    _check_table([first], expected, layer=None)
    assert "model.norm.weight" in tensor_names(last) and "model.norm.weight" not in tensor_names(first)
    assert not any(n.startswith("lm_head") for n in tensor_names(last))
    _check_table([last], expected, layer=None)


# ---- FusedMoE (tiny-qwen3-moe: 8 experts, hidden 64, moe intermediate 32) -----------------------
# w13_weight [E_local, 2*I/moe_tp, 64] = [w1 = gate shard; w3 = up shard]; w2_weight [E_local, 64, I/moe_tp].
# (tp, ep): ep 1 -> every rank all 8 experts, I split over tp; ep = tp -> moe tp 1, experts contiguous.
VLLM_MOE = {
    (2, 1): {
        "mlp.experts.routed_experts.w13_weight": [
            ((8, 32, 64), [  # rank 0
                "[0:1, 0:16, 0:64] <- mlp.experts.0.gate_proj.weight[0:16, 0:64]",
                "[0:1, 16:32, 0:64] <- mlp.experts.0.up_proj.weight[0:16, 0:64]",
                "[1:2, 0:16, 0:64] <- mlp.experts.1.gate_proj.weight[0:16, 0:64]",
                "[1:2, 16:32, 0:64] <- mlp.experts.1.up_proj.weight[0:16, 0:64]",
                "[2:3, 0:16, 0:64] <- mlp.experts.2.gate_proj.weight[0:16, 0:64]",
                "[2:3, 16:32, 0:64] <- mlp.experts.2.up_proj.weight[0:16, 0:64]",
                "[3:4, 0:16, 0:64] <- mlp.experts.3.gate_proj.weight[0:16, 0:64]",
                "[3:4, 16:32, 0:64] <- mlp.experts.3.up_proj.weight[0:16, 0:64]",
                "[4:5, 0:16, 0:64] <- mlp.experts.4.gate_proj.weight[0:16, 0:64]",
                "[4:5, 16:32, 0:64] <- mlp.experts.4.up_proj.weight[0:16, 0:64]",
                "[5:6, 0:16, 0:64] <- mlp.experts.5.gate_proj.weight[0:16, 0:64]",
                "[5:6, 16:32, 0:64] <- mlp.experts.5.up_proj.weight[0:16, 0:64]",
                "[6:7, 0:16, 0:64] <- mlp.experts.6.gate_proj.weight[0:16, 0:64]",
                "[6:7, 16:32, 0:64] <- mlp.experts.6.up_proj.weight[0:16, 0:64]",
                "[7:8, 0:16, 0:64] <- mlp.experts.7.gate_proj.weight[0:16, 0:64]",
                "[7:8, 16:32, 0:64] <- mlp.experts.7.up_proj.weight[0:16, 0:64]",
            ]),
            ((8, 32, 64), [  # rank 1
                "[0:1, 0:16, 0:64] <- mlp.experts.0.gate_proj.weight[16:32, 0:64]",
                "[0:1, 16:32, 0:64] <- mlp.experts.0.up_proj.weight[16:32, 0:64]",
                "[1:2, 0:16, 0:64] <- mlp.experts.1.gate_proj.weight[16:32, 0:64]",
                "[1:2, 16:32, 0:64] <- mlp.experts.1.up_proj.weight[16:32, 0:64]",
                "[2:3, 0:16, 0:64] <- mlp.experts.2.gate_proj.weight[16:32, 0:64]",
                "[2:3, 16:32, 0:64] <- mlp.experts.2.up_proj.weight[16:32, 0:64]",
                "[3:4, 0:16, 0:64] <- mlp.experts.3.gate_proj.weight[16:32, 0:64]",
                "[3:4, 16:32, 0:64] <- mlp.experts.3.up_proj.weight[16:32, 0:64]",
                "[4:5, 0:16, 0:64] <- mlp.experts.4.gate_proj.weight[16:32, 0:64]",
                "[4:5, 16:32, 0:64] <- mlp.experts.4.up_proj.weight[16:32, 0:64]",
                "[5:6, 0:16, 0:64] <- mlp.experts.5.gate_proj.weight[16:32, 0:64]",
                "[5:6, 16:32, 0:64] <- mlp.experts.5.up_proj.weight[16:32, 0:64]",
                "[6:7, 0:16, 0:64] <- mlp.experts.6.gate_proj.weight[16:32, 0:64]",
                "[6:7, 16:32, 0:64] <- mlp.experts.6.up_proj.weight[16:32, 0:64]",
                "[7:8, 0:16, 0:64] <- mlp.experts.7.gate_proj.weight[16:32, 0:64]",
                "[7:8, 16:32, 0:64] <- mlp.experts.7.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "mlp.experts.routed_experts.w2_weight": [
            ((8, 64, 16), [  # rank 0
                "[0:1, 0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 0:16]",
                "[1:2, 0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 0:16]",
                "[2:3, 0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 0:16]",
                "[3:4, 0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 0:16]",
                "[4:5, 0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 0:16]",
                "[5:6, 0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 0:16]",
                "[6:7, 0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 0:16]",
                "[7:8, 0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 0:16]",
            ]),
            ((8, 64, 16), [  # rank 1
                "[0:1, 0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 16:32]",
                "[1:2, 0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 16:32]",
                "[2:3, 0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 16:32]",
                "[3:4, 0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 16:32]",
                "[4:5, 0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 16:32]",
                "[5:6, 0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 16:32]",
                "[6:7, 0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 16:32]",
                "[7:8, 0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 16:32]",
            ]),
        ],
    },
    (2, 2): {
        "mlp.experts.routed_experts.w13_weight": [
            ((4, 64, 64), [  # rank 0
                "[0:1, 0:32, 0:64] <- mlp.experts.0.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.0.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.1.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.1.up_proj.weight[0:32, 0:64]",
                "[2:3, 0:32, 0:64] <- mlp.experts.2.gate_proj.weight[0:32, 0:64]",
                "[2:3, 32:64, 0:64] <- mlp.experts.2.up_proj.weight[0:32, 0:64]",
                "[3:4, 0:32, 0:64] <- mlp.experts.3.gate_proj.weight[0:32, 0:64]",
                "[3:4, 32:64, 0:64] <- mlp.experts.3.up_proj.weight[0:32, 0:64]",
            ]),
            ((4, 64, 64), [  # rank 1
                "[0:1, 0:32, 0:64] <- mlp.experts.4.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.4.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.5.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.5.up_proj.weight[0:32, 0:64]",
                "[2:3, 0:32, 0:64] <- mlp.experts.6.gate_proj.weight[0:32, 0:64]",
                "[2:3, 32:64, 0:64] <- mlp.experts.6.up_proj.weight[0:32, 0:64]",
                "[3:4, 0:32, 0:64] <- mlp.experts.7.gate_proj.weight[0:32, 0:64]",
                "[3:4, 32:64, 0:64] <- mlp.experts.7.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "mlp.experts.routed_experts.w2_weight": [
            ((4, 64, 32), [  # rank 0
                "[0:1, 0:64, 0:32] <- mlp.experts.0.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.1.down_proj.weight[0:64, 0:32]",
                "[2:3, 0:64, 0:32] <- mlp.experts.2.down_proj.weight[0:64, 0:32]",
                "[3:4, 0:64, 0:32] <- mlp.experts.3.down_proj.weight[0:64, 0:32]",
            ]),
            ((4, 64, 32), [  # rank 1
                "[0:1, 0:64, 0:32] <- mlp.experts.4.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.5.down_proj.weight[0:64, 0:32]",
                "[2:3, 0:64, 0:32] <- mlp.experts.6.down_proj.weight[0:64, 0:32]",
                "[3:4, 0:64, 0:32] <- mlp.experts.7.down_proj.weight[0:64, 0:32]",
            ]),
        ],
    },
    (4, 4): {
        "mlp.experts.routed_experts.w13_weight": [
            ((2, 64, 64), [  # rank 0
                "[0:1, 0:32, 0:64] <- mlp.experts.0.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.0.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.1.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.1.up_proj.weight[0:32, 0:64]",
            ]),
            ((2, 64, 64), [  # rank 1
                "[0:1, 0:32, 0:64] <- mlp.experts.2.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.2.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.3.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.3.up_proj.weight[0:32, 0:64]",
            ]),
            ((2, 64, 64), [  # rank 2
                "[0:1, 0:32, 0:64] <- mlp.experts.4.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.4.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.5.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.5.up_proj.weight[0:32, 0:64]",
            ]),
            ((2, 64, 64), [  # rank 3
                "[0:1, 0:32, 0:64] <- mlp.experts.6.gate_proj.weight[0:32, 0:64]",
                "[0:1, 32:64, 0:64] <- mlp.experts.6.up_proj.weight[0:32, 0:64]",
                "[1:2, 0:32, 0:64] <- mlp.experts.7.gate_proj.weight[0:32, 0:64]",
                "[1:2, 32:64, 0:64] <- mlp.experts.7.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "mlp.experts.routed_experts.w2_weight": [
            ((2, 64, 32), [  # rank 0
                "[0:1, 0:64, 0:32] <- mlp.experts.0.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.1.down_proj.weight[0:64, 0:32]",
            ]),
            ((2, 64, 32), [  # rank 1
                "[0:1, 0:64, 0:32] <- mlp.experts.2.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.3.down_proj.weight[0:64, 0:32]",
            ]),
            ((2, 64, 32), [  # rank 2
                "[0:1, 0:64, 0:32] <- mlp.experts.4.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.5.down_proj.weight[0:64, 0:32]",
            ]),
            ((2, 64, 32), [  # rank 3
                "[0:1, 0:64, 0:32] <- mlp.experts.6.down_proj.weight[0:64, 0:32]",
                "[1:2, 0:64, 0:32] <- mlp.experts.7.down_proj.weight[0:64, 0:32]",
            ]),
        ],
    },
}


@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (2, 2), (4, 4)])
def test_vllm_fused_moe_tables(tp: int, ep: int) -> None:
    mesh = {"tp": tp} if ep == 1 else {"tp": tp, "ep": ep}
    resolved = _resolve({"bundled": "tiny-qwen3-moe"}, {"preset": "vllm", "mesh": mesh})
    for layer in (0, 1):  # every layer is MoE; same table with the layer's experts
        _check_table(resolved.rollout.ranks, VLLM_MOE[(tp, ep)], layer=layer)
    for rank in resolved.rollout.ranks:  # no per-expert local tensors survive
        assert not any(".experts." in n and n.endswith("_proj.weight") for n in tensor_names(rank))


# ---- DeepSeek-V3 MLA + shared experts (tiny-deepseek-v3 at tp 2) ---------------------------------
# q_lora 32, kv_lora 16, qk_nope 16, qk_rope 8, v 16, 8 heads: q_b_proj [8*24=192, 32],
# kv_b_proj [8*(16+16)=256, 16], o_proj [64, 8*16=128]; fused_qkv_a_proj replicated [32 + 24, 64].
# Layer 0 is dense (first_k_dense_replace 1); layer 1 holds 1 shared expert (moe intermediate 32).
VLLM_DEEPSEEK_TP2 = {
    "layer0": {
        "self_attn.fused_qkv_a_proj.weight": [
            ((56, 64), [  # rank 0
                "[0:32, 0:64] <- self_attn.q_a_proj.weight[0:32, 0:64]",
                "[32:56, 0:64] <- self_attn.kv_a_proj_with_mqa.weight[0:24, 0:64]",
            ]),
            ((56, 64), [  # rank 1
                "[0:32, 0:64] <- self_attn.q_a_proj.weight[0:32, 0:64]",
                "[32:56, 0:64] <- self_attn.kv_a_proj_with_mqa.weight[0:24, 0:64]",
            ]),
        ],
        "self_attn.q_b_proj.weight": [
            ((96, 32), [  # rank 0
                "[0:96, 0:32] <- self_attn.q_b_proj.weight[0:96, 0:32]",
            ]),
            ((96, 32), [  # rank 1
                "[0:96, 0:32] <- self_attn.q_b_proj.weight[96:192, 0:32]",
            ]),
        ],
        "self_attn.kv_b_proj.weight": [
            ((128, 16), [  # rank 0
                "[0:128, 0:16] <- self_attn.kv_b_proj.weight[0:128, 0:16]",
            ]),
            ((128, 16), [  # rank 1
                "[0:128, 0:16] <- self_attn.kv_b_proj.weight[128:256, 0:16]",
            ]),
        ],
        "self_attn.o_proj.weight": [
            ((64, 64), [  # rank 0
                "[0:64, 0:64] <- self_attn.o_proj.weight[0:64, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:64, 0:64] <- self_attn.o_proj.weight[0:64, 64:128]",
            ]),
        ],
    },
    "layer1": {
        "mlp.shared_experts.gate_up_proj.weight": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.shared_experts.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.shared_experts.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.shared_experts.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.shared_experts.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "mlp.shared_experts.down_proj.weight": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.shared_experts.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.shared_experts.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "mlp.gate.e_score_correction_bias": [
            ((8,), [  # rank 0
                "[0:8] <- mlp.gate.e_score_correction_bias[0:8]",
            ]),
            ((8,), [  # rank 1
                "[0:8] <- mlp.gate.e_score_correction_bias[0:8]",
            ]),
        ],
    },
}


def test_vllm_deepseek_mla_tables_tp2() -> None:
    resolved = _resolve({"bundled": "tiny-deepseek-v3"}, {"preset": "vllm", "mesh": {"tp": 2}, "dtype": "bfloat16"})
    ranks = resolved.rollout.ranks
    _check_table(ranks, VLLM_DEEPSEEK_TP2["layer0"], layer=0)
    _check_table(ranks, VLLM_DEEPSEEK_TP2["layer1"], layer=1)
    for rank in ranks:
        names = tensor_names(rank)
        # The two down-projections exist only fused.
        assert not any(re.search(r"\.(q_a_proj|kv_a_proj_with_mqa)\.weight$", n) for n in names)
        # The router correction bias stays float32 on a bf16 engine.
        assert rank.tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype == "float32"
        assert rank.tensor("model.layers.1.self_attn.q_b_proj.weight").dtype == "bfloat16"
        # Routed experts at tp 2 without EP: all 8, moe intermediate 32 split in 16.
        assert rank.tensor("model.layers.1.mlp.experts.routed_experts.w13_weight").shape == (8, 32, 64)
        assert rank.tensor("model.layers.1.mlp.experts.routed_experts.w2_weight").shape == (8, 64, 16)


def test_vllm_deepseek_router_gate_weight_in_model_dtype() -> None:
    # DeepSeekV2Gate is a ReplicatedLinear built with params_dtype=None, i.e. the model dtype
    # (config torch_dtype bfloat16); only e_score_correction_bias is created float32. transformers 5
    # keeps gate.weight float32 in the checkpoint layout (_keep_in_fp32_modules_strict), so the
    # engine holds a bf16 copy of a float32 canonical tensor.
    resolved = _resolve({"bundled": "tiny-deepseek-v3"}, {"preset": "vllm", "mesh": {"tp": 2}})
    assert resolved.canonical["model.layers.1.mlp.gate.weight"].dtype in ("float32", "bfloat16")  # transformers' choice
    gate = resolved.rollout.ranks[0].tensor("model.layers.1.mlp.gate.weight")
    assert (gate.shape, gate.dtype) == ((8, 64), "bfloat16")
