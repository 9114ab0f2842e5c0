"""The ``megatron`` preset against what a Megatron-Core (TE layer spec) rank holds.

Every expected value below is a literal table (local shape; ``local box <-
canonical[box]`` per piece), worked out by hand from Megatron-Core's modules, not
from the preset's rule formulas. Boxes are ``[start:stop, ...]`` per dim;
canonical names of layer tensors are relative to ``model.layers.<L>.``.

Derived from (NVIDIA/Megatron-LM, read for these tables):

* ``megatron/core/transformer/attention.py``: ``Attention.__init__``
  (``num_query_groups_per_partition = num_query_groups // tp``), ``SelfAttention.__init__``
  (``linear_qkv`` output ``query_projection_size + 2 * kv_projection_size``, column
  parallel), ``SelfAttention.get_query_key_value_tensors`` (the local output is viewed
  as ``[ng_local, (np/ng + 2) * hn]`` and split ``[np/ng * hn, hn, hn]``: per query
  group its q heads, then its k head, then its v head; groups dealt contiguously over
  tp).
* ``megatron/core/transformer/mlp.py`` / ``moe/experts.py``: gated linear unit fc1 is
  ``torch.chunk(x, 2, dim=-1)`` -> ``act(x[0]) * x[1]`` on the *local* output, so a rank
  holds [gate shard; up shard]; ``linear_fc2`` / ``linear_proj`` are row parallel (dim 1).
  ``TEGroupedMLP``: ``linear_fc1`` / ``linear_fc2`` are TE ``GroupedLinear`` modules whose
  parameters are ``weight0 .. weight{num_local_experts-1}``, split over the expert
  tensor-parallel group (``pg_collection.expt_tp``); local expert ``i`` is global expert
  ``ep_rank * num_local_experts + i`` (``SequentialMLP.sharded_state_dict``:
  ``local_expert_indices_offset``).
* ``megatron/training/tokenizer/tokenizer.py``: ``_vocab_size_with_padding``
  (``multiple = make_vocab_size_divisible_by * tensor_model_parallel_size``, default 128);
  ``megatron/core/tensor_parallel/layers.py``: ``VocabParallelEmbedding`` (padded vocab
  split evenly, ``vocab_start_index = rank * per_partition``).
* ``megatron/core/models/gpt/gpt_model.py``: ``GPTModel.__init__`` (``embedding`` only with
  ``pre_process``, ``output_layer`` only with ``post_process``,
  ``skip_weight_param_allocation = pre_process and share_embeddings_and_output_weights``:
  tied + pp 1 -> no ``output_layer.weight``; tied + pp > 1 -> the last stage allocates one,
  initialised from / synced with the word embeddings), ``GPTModel.sharded_state_dict``
  (that copy maps to ``embedding.word_embeddings.weight``);
  ``megatron/core/transformer/transformer_block.py``: layers of a stage are a local
  ``ModuleList`` (``decoder.layers.<local index>``), ``final_layernorm`` with ``post_process``.
* ``megatron/core/parallel_state.py``: ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``
  / ``RankGenerator`` (tp fastest, then cp, dp, pp; the expert view ``etp-ep-edp`` within a
  stage), where ``expert_tensor_parallel_size`` defaults to ``tensor_model_parallel_size``
  (also in ``megatron/training/arguments.py``: ``validate_args``).
"""

from __future__ import annotations


import pytest

from preset_helpers import check_table, qwen2, tensor_names, view
from preset_helpers import resolve as _resolve_any


def _resolve(model: dict, trainer: dict, rollout: dict | None = None):
    return _resolve_any(model, trainer=trainer, rollout=rollout)


# ---- helpers (restructure only; no sharding arithmetic) ------------------------------------


def _check_table(ranks, table: dict, strip: str = "model.layers.0.") -> None:
    check_table(ranks, table, strip)


# ---- GQA linear_qkv: per query group [4 q heads (32 rows); 1 k head (8); 1 v head (8)] ---------
# 2 query groups of 48 rows. tp 1 holds both groups, interleaved; tp 2 holds one group per rank.
MEGATRON_QKV = {
    1: {
        "decoder.layers.0.self_attention.linear_qkv.weight": [
            ((96, 64), [  # rank 0
                "[0:32, 0:64] <- self_attn.q_proj.weight[0:32, 0:64]",
                "[32:40, 0:64] <- self_attn.k_proj.weight[0:8, 0:64]",
                "[40:48, 0:64] <- self_attn.v_proj.weight[0:8, 0:64]",
                "[48:80, 0:64] <- self_attn.q_proj.weight[32:64, 0:64]",
                "[80:88, 0:64] <- self_attn.k_proj.weight[8:16, 0:64]",
                "[88:96, 0:64] <- self_attn.v_proj.weight[8:16, 0:64]",
            ]),
        ],
        "decoder.layers.0.self_attention.linear_qkv.bias": [
            ((96,), [  # rank 0
                "[0:32] <- self_attn.q_proj.bias[0:32]",
                "[32:40] <- self_attn.k_proj.bias[0:8]",
                "[40:48] <- self_attn.v_proj.bias[0:8]",
                "[48:80] <- self_attn.q_proj.bias[32:64]",
                "[80:88] <- self_attn.k_proj.bias[8:16]",
                "[88:96] <- self_attn.v_proj.bias[8:16]",
            ]),
        ],
    },
    2: {
        "decoder.layers.0.self_attention.linear_qkv.weight": [
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
        "decoder.layers.0.self_attention.linear_qkv.bias": [
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
    },
}


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_linear_qkv_interleaved_per_query_group(tp: int) -> None:
    resolved = _resolve(qwen2(), {"preset": "megatron", "mesh": {"tp": tp}})
    _check_table(resolved.trainer.ranks, MEGATRON_QKV[tp])


# ---- tp 2: linear_proj, linear_fc1 = [gate; up], linear_fc2, vocabulary padding ---------------
# vocab 100 padded to a multiple of 128 * 2 = 256: 128 rows per rank, rank 1 is all padding.
MEGATRON_TP2 = {
    2: {
        "decoder.layers.0.self_attention.linear_proj.weight": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- self_attn.o_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- self_attn.o_proj.weight[0:64, 32:64]",
            ]),
        ],
        "decoder.layers.0.mlp.linear_fc1.weight": [
            ((96, 64), [  # rank 0
                "[0:48, 0:64] <- mlp.gate_proj.weight[0:48, 0:64]",
                "[48:96, 0:64] <- mlp.up_proj.weight[0:48, 0:64]",
            ]),
            ((96, 64), [  # rank 1
                "[0:48, 0:64] <- mlp.gate_proj.weight[48:96, 0:64]",
                "[48:96, 0:64] <- mlp.up_proj.weight[48:96, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.linear_fc2.weight": [
            ((64, 48), [  # rank 0
                "[0:64, 0:48] <- mlp.down_proj.weight[0:64, 0:48]",
            ]),
            ((64, 48), [  # rank 1
                "[0:64, 0:48] <- mlp.down_proj.weight[0:64, 48:96]",
            ]),
        ],
        "embedding.word_embeddings.weight": [
            ((128, 64), [  # rank 0
                "[0:100, 0:64] <- model.embed_tokens.weight[0:100, 0:64]",
            ]),
            ((128, 64), []),  # rank 1: padding only
        ],
        "output_layer.weight": [
            ((128, 64), [  # rank 0
                "[0:100, 0:64] <- lm_head.weight[0:100, 0:64]",
            ]),
            ((128, 64), []),  # rank 1: padding only
        ],
    },
}


def test_megatron_tp2_dense_tables() -> None:
    resolved = _resolve(qwen2(), {"preset": "megatron", "mesh": {"tp": 2}})
    _check_table(resolved.trainer.ranks, MEGATRON_TP2[2])
    for rank in resolved.trainer.ranks:  # input norms are fused into the next linear (TE spec)
        assert rank.tensor("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight").pieces[0].canonical == (
            "model.layers.0.input_layernorm.weight"
        )
        assert rank.tensor("decoder.layers.0.mlp.linear_fc1.layer_norm_weight").pieces[0].canonical == (
            "model.layers.0.post_attention_layernorm.weight"
        )


# ---- pipeline stages -----------------------------------------------------------------------------
LAYER_LOCALS = {
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_proj.weight",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc1.layer_norm_weight",
    "mlp.linear_fc2.weight",
}


def test_megatron_pp2_stage_placement_and_local_layer_names() -> None:
    resolved = _resolve(qwen2(layers=4), {"preset": "megatron", "mesh": {"pp": 2}})
    stage0, stage1 = resolved.trainer.ranks
    assert (dict(stage0.coords)["pp"], dict(stage1.coords)["pp"]) == (0, 1)
    layer_names = {f"decoder.layers.{i}.{n}" for i in (0, 1) for n in LAYER_LOCALS}
    assert tensor_names(stage0) == layer_names | {"embedding.word_embeddings.weight"}
    assert tensor_names(stage1) == layer_names | {"decoder.final_layernorm.weight", "output_layer.weight"}
    # decoder.layers.<local> of stage 1 are the model's layers 2 and 3.
    for local, layer in ((0, 2), (1, 3)):
        t = stage1.tensor(f"decoder.layers.{local}.mlp.linear_fc2.weight")
        assert [p.canonical for p in t.pieces] == [f"model.layers.{layer}.mlp.down_proj.weight"]
    for local, layer in ((0, 0), (1, 1)):
        t = stage0.tensor(f"decoder.layers.{local}.self_attention.linear_qkv.weight")
        assert {p.canonical for p in t.pieces} == {f"model.layers.{layer}.self_attn.{x}_proj.weight" for x in "qkv"}
    _check_table(
        [stage1],
        {
            "decoder.final_layernorm.weight": [((64,), ["[0:64] <- model.norm.weight[0:64]"])],
            "output_layer.weight": [((128, 64), ["[0:100, 0:64] <- lm_head.weight[0:100, 0:64]"])],
        },
    )
    _check_table(
        [stage0],
        {
            "embedding.word_embeddings.weight": [
                ((128, 64), ["[0:100, 0:64] <- model.embed_tokens.weight[0:100, 0:64]"]),
            ],
        },
    )


def test_megatron_tied_embeddings_pp2_output_layer_on_last_stage() -> None:
    resolved = _resolve(qwen2(tied=True, layers=2), {"preset": "megatron", "mesh": {"tp": 2, "pp": 2}})
    ranks = resolved.trainer.ranks
    first = [r for r in ranks if dict(r.coords)["pp"] == 0]
    last = [r for r in ranks if dict(r.coords)["pp"] == 1]
    table = [
        ((128, 64), ["[0:100, 0:64] <- model.embed_tokens.weight[0:100, 0:64]"]),  # tp rank 0
        ((128, 64), []),  # tp rank 1: padding only (vocab 100 -> 256)
    ]
    _check_table(first, {"embedding.word_embeddings.weight": table})
    _check_table(last, {"output_layer.weight": table})
    assert all("output_layer.weight" not in tensor_names(r) for r in first)
    assert all("embedding.word_embeddings.weight" not in tensor_names(r) for r in last)


def test_megatron_tied_embeddings_pp1_no_output_layer() -> None:
    resolved = _resolve(qwen2(tied=True), {"preset": "megatron", "mesh": {"tp": 2}})
    for rank in resolved.trainer.ranks:
        names = tensor_names(rank)
        assert "output_layer.weight" not in names and "embedding.word_embeddings.weight" in names
        assert "decoder.final_layernorm.weight" in names


# ---- rank order: tp fastest, then dp, then pp ("tp-cp-ep-dp-pp") ---------------------------------
MEGATRON_COORDS_TP2_DP2_PP2 = [
    # rank: (tp, dp, pp)
    (0, 0, 0),
    (1, 0, 0),
    (0, 1, 0),
    (1, 1, 0),
    (0, 0, 1),
    (1, 0, 1),
    (0, 1, 1),
    (1, 1, 1),
]


def test_megatron_rank_order_tp_dp_pp() -> None:
    resolved = _resolve(qwen2(layers=2), {"preset": "megatron", "mesh": {"tp": 2, "pp": 2, "dp": 2}})
    ranks = resolved.trainer.ranks
    got = [(dict(r.coords)["tp"], dict(r.coords)["dp"], dict(r.coords)["pp"]) for r in ranks]
    assert got == MEGATRON_COORDS_TP2_DP2_PP2
    # rank 5 = tp 1 of the last stage: the second half of layer 1's linear_proj columns.
    assert view(ranks[5], "decoder.layers.0.self_attention.linear_proj.weight", "model.layers.1.") == (
        (64, 32),
        ["[0:64, 0:32] <- self_attn.o_proj.weight[0:64, 32:64]"],
    )
    assert "output_layer.weight" in tensor_names(ranks[5]) and "embedding.word_embeddings.weight" in tensor_names(ranks[2])


# ---- TEGroupedMLP experts (tiny-qwen3-moe: 8 experts, hidden 64, moe intermediate 32) ------------
# mesh tp 2, ep 2, etp 1: rank r is expert-parallel rank r (etp fastest), 4 whole experts each.
MEGATRON_EXPERTS_EP2_ETP1 = {
    "ep2_etp1": {
        "decoder.layers.0.mlp.experts.linear_fc1.weight0": [
            ((64, 64), [  # rank 0
                "[0:32, 0:64] <- mlp.experts.0.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.0.up_proj.weight[0:32, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:32, 0:64] <- mlp.experts.4.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.4.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight0": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- mlp.experts.0.down_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- mlp.experts.4.down_proj.weight[0:64, 0:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight1": [
            ((64, 64), [  # rank 0
                "[0:32, 0:64] <- mlp.experts.1.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.1.up_proj.weight[0:32, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:32, 0:64] <- mlp.experts.5.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.5.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight1": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- mlp.experts.1.down_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- mlp.experts.5.down_proj.weight[0:64, 0:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight2": [
            ((64, 64), [  # rank 0
                "[0:32, 0:64] <- mlp.experts.2.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.2.up_proj.weight[0:32, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:32, 0:64] <- mlp.experts.6.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.6.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight2": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- mlp.experts.2.down_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- mlp.experts.6.down_proj.weight[0:64, 0:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight3": [
            ((64, 64), [  # rank 0
                "[0:32, 0:64] <- mlp.experts.3.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.3.up_proj.weight[0:32, 0:64]",
            ]),
            ((64, 64), [  # rank 1
                "[0:32, 0:64] <- mlp.experts.7.gate_proj.weight[0:32, 0:64]",
                "[32:64, 0:64] <- mlp.experts.7.up_proj.weight[0:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight3": [
            ((64, 32), [  # rank 0
                "[0:64, 0:32] <- mlp.experts.3.down_proj.weight[0:64, 0:32]",
            ]),
            ((64, 32), [  # rank 1
                "[0:64, 0:32] <- mlp.experts.7.down_proj.weight[0:64, 0:32]",
            ]),
        ],
    },
}

# mesh tp 2 (ep 1, etp defaults to tp = 2): every rank all 8 experts, intermediate split 16 / 16.
MEGATRON_EXPERTS_EP1_ETP2 = {
    "ep1_etp2": {
        "decoder.layers.0.mlp.experts.linear_fc1.weight0": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.0.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.0.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.0.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.0.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight0": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight1": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.1.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.1.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.1.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.1.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight1": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight2": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.2.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.2.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.2.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.2.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight2": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight3": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.3.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.3.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.3.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.3.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight3": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight4": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.4.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.4.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.4.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.4.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight4": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight5": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.5.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.5.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.5.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.5.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight5": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight6": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.6.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.6.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.6.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.6.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight6": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 16:32]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc1.weight7": [
            ((32, 64), [  # rank 0
                "[0:16, 0:64] <- mlp.experts.7.gate_proj.weight[0:16, 0:64]",
                "[16:32, 0:64] <- mlp.experts.7.up_proj.weight[0:16, 0:64]",
            ]),
            ((32, 64), [  # rank 1
                "[0:16, 0:64] <- mlp.experts.7.gate_proj.weight[16:32, 0:64]",
                "[16:32, 0:64] <- mlp.experts.7.up_proj.weight[16:32, 0:64]",
            ]),
        ],
        "decoder.layers.0.mlp.experts.linear_fc2.weight7": [
            ((64, 16), [  # rank 0
                "[0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 0:16]",
            ]),
            ((64, 16), [  # rank 1
                "[0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 16:32]",
            ]),
        ],
    },
}


@pytest.mark.parametrize(
    ("mesh", "table"),
    [
        ({"tp": 2, "ep": 2, "etp": 1}, MEGATRON_EXPERTS_EP2_ETP1["ep2_etp1"]),
        ({"tp": 2}, MEGATRON_EXPERTS_EP1_ETP2["ep1_etp2"]),
    ],
    ids=["ep2-etp1", "ep1-etp2-default"],
)
def test_megatron_grouped_experts(mesh: dict, table: dict) -> None:
    resolved = _resolve({"bundled": "tiny-qwen3-moe"}, {"preset": "megatron", "mesh": mesh})
    ranks = resolved.trainer.ranks
    assert len(ranks) == 2
    _check_table(ranks, table)
    layer1 = {k.replace("decoder.layers.0.", "decoder.layers.1."): v for k, v in table.items()}
    _check_table(ranks, layer1, strip="model.layers.1.")
    for rank in ranks:
        names = tensor_names(rank)
        fc1 = sorted(n for n in names if n.startswith("decoder.layers.0.mlp.experts.linear_fc1.weight"))
        assert len(fc1) == len([k for k in table if "linear_fc1" in k])  # nothing beyond the table
        # MoE layers keep a separate pre-MLP norm and a replicated router.
        assert "decoder.layers.0.pre_mlp_layernorm.weight" in names
        assert rank.tensor("decoder.layers.0.mlp.router.weight").shape == (8, 64)
