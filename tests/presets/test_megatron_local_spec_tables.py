"""The ``megatron`` preset with ``local_spec: true`` / ``moe_grouped_gemm: false``: literal tables.

These two params describe what a live Megatron-Core 0.16.1 model built with
``get_gpt_layer_local_spec(..., moe_grouped_gemm=False)`` holds (found by introspecting real
models, ``tests/megatron_trainer``; the default TE names are in ``test_megatron_tables.py``):

* the local spec keeps ``input_layernorm.weight`` and ``pre_mlp_layernorm.weight`` as modules of
  their own (the TE spec fuses them into ``linear_qkv.layer_norm_weight`` /
  ``linear_fc1.layer_norm_weight``);
* ``SequentialMLP`` experts are ``mlp.experts.local_experts.<j>.linear_fc{1,2}.weight`` (one module
  per local expert, ``TEGroupedMLP``'s are ``linear_fc1.weight<j>``); local expert ``j`` on EP rank
  ``e`` is global expert ``e * num_local_experts + j`` (RECIPES.md: EP2, 8 experts, rank 1 holds
  global experts 4-7).

Expected values are literal (shape; ``local box <- canonical[box]``), layer names relative to
``model.layers.0.``. No Megatron needed.
"""

from __future__ import annotations

from preset_helpers import check_table, qwen2, tensor_names
from preset_helpers import resolve

LOCAL = {"local_spec": True, "moe_grouped_gemm": False}


def test_local_spec_dense_norms_are_their_own_tensors() -> None:
    resolved = resolve(qwen2(), trainer={"preset": "megatron", "mesh": {"tp": 2}, "params": LOCAL})
    ranks = resolved.trainer.ranks
    check_table(ranks, {
        "decoder.layers.0.input_layernorm.weight": [((64,), ["[0:64] <- input_layernorm.weight[0:64]"])] * 2,
        "decoder.layers.0.pre_mlp_layernorm.weight": [((64,), ["[0:64] <- post_attention_layernorm.weight[0:64]"])] * 2,
    }, "model.layers.0.")
    for r in ranks:
        assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" not in tensor_names(r)
        assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" not in tensor_names(r)


def test_sequential_mlp_experts_ep2() -> None:
    resolved = resolve({"bundled": "tiny-qwen3-moe"},
                       trainer={"preset": "megatron", "mesh": {"ep": 2, "dp": 2}, "params": LOCAL})
    ranks = resolved.trainer.ranks
    table = {
        "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight": [
            ((64, 64), ["[0:32, 0:64] <- mlp.experts.0.gate_proj.weight[0:32, 0:64]",
                        "[32:64, 0:64] <- mlp.experts.0.up_proj.weight[0:32, 0:64]"]),
            ((64, 64), ["[0:32, 0:64] <- mlp.experts.4.gate_proj.weight[0:32, 0:64]",
                        "[32:64, 0:64] <- mlp.experts.4.up_proj.weight[0:32, 0:64]"]),
        ],
        "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight": [
            ((64, 32), ["[0:64, 0:32] <- mlp.experts.3.down_proj.weight[0:64, 0:32]"]),
            ((64, 32), ["[0:64, 0:32] <- mlp.experts.7.down_proj.weight[0:64, 0:32]"]),
        ],
        "decoder.layers.0.mlp.router.weight": [((8, 64), ["[0:8, 0:64] <- mlp.gate.weight[0:8, 0:64]"])] * 2,
        "decoder.layers.0.pre_mlp_layernorm.weight": [((64,), ["[0:64] <- post_attention_layernorm.weight[0:64]"])] * 2,
        "decoder.layers.0.input_layernorm.weight": [((64,), ["[0:64] <- input_layernorm.weight[0:64]"])] * 2,
    }
    check_table(ranks, table, "model.layers.0.")
    for r in ranks:
        names = tensor_names(r)
        assert not [n for n in names if ".experts.linear_fc" in n], "no TEGroupedMLP names with moe_grouped_gemm: false"
        assert "decoder.layers.0.mlp.experts.local_experts.4.linear_fc1.weight" not in names  # 4 local experts


def test_sequential_mlp_expert_tp2() -> None:
    """tp 2, ep 1: etp defaults to tp, each expert's [gate; up] rows split over etp."""
    resolved = resolve({"bundled": "tiny-qwen3-moe"}, trainer={"preset": "megatron", "mesh": {"tp": 2}, "params": LOCAL})
    check_table(resolved.trainer.ranks, {
        "decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight": [
            ((32, 64), ["[0:16, 0:64] <- mlp.experts.5.gate_proj.weight[0:16, 0:64]",
                        "[16:32, 0:64] <- mlp.experts.5.up_proj.weight[0:16, 0:64]"]),
            ((32, 64), ["[0:16, 0:64] <- mlp.experts.5.gate_proj.weight[16:32, 0:64]",
                        "[16:32, 0:64] <- mlp.experts.5.up_proj.weight[16:32, 0:64]"]),
        ],
        "decoder.layers.0.mlp.experts.local_experts.5.linear_fc2.weight": [
            ((64, 16), ["[0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 0:16]"]),
            ((64, 16), ["[0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 16:32]"]),
        ],
    }, "model.layers.0.")
