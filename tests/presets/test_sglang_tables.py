"""The ``sglang`` preset: only where SGLang's layers differ from vLLM's.

Literal tables (local shape; ``local box <- canonical[box]`` per piece), worked out
by hand from SGLang's model code, not from the preset's rules; boxes are
``[start:stop, ...]``; canonical names of layer tensors are relative to
``model.layers.<L>.``. Everything not listed here is checked to be identical to the
``vllm`` preset's layout (tests/presets/test_vllm_tables.py pins that one down):
SGLang's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` / ``VocabParallelEmbedding``
(``python/sglang/srt/layers/linear.py``, ``python/sglang/srt/layers/vocab_parallel_embedding.py``:
``DEFAULT_VOCAB_PADDING_SIZE = 64``, same ``_get_indices``) are adapted from vLLM's.

Derived from (sgl-project/sglang, read for these tables):

* ``python/sglang/srt/models/deepseek_v2.py``: ``DeepseekV2AttentionMLA.__init__``
  (with ``q_lora_rank``: ``fused_qkv_a_proj_with_mqa = ReplicatedLinear(hidden,
  q_lora_rank + kv_lora_rank + qk_rope_head_dim)``; no separate ``q_a_proj`` /
  ``kv_a_proj_with_mqa``), ``DeepseekV2ForCausalLM.load_weights`` (caches ``q_a_proj`` and
  ``kv_a_proj_with_mqa`` and loads ``torch.cat([q_a_proj_weight, kv_a_proj_weight], dim=0)``
  into ``fused_qkv_a_proj_with_mqa``).
* ``python/sglang/srt/models/qwen2.py`` / ``qwen3.py``: ``Qwen2ForCausalLM.__init__``
  (``lm_head = model.embed_tokens`` only when ``pp_group.world_size == 1`` and tied;
  otherwise the last PP rank builds its own ``ParallelLMHead`` and, when tied, copies the
  first rank's embedding into it), ``load_weights`` (on the last PP rank
  ``model.embed_tokens.weight`` is loaded into ``lm_head.weight``); ``Qwen2Model.__init__``
  (``embed_tokens`` only on the first PP rank).
* ``python/sglang/srt/distributed/parallel_state.py``: ``initialize_model_parallel``
  (``moe_tp_size = tp_size // moe_ep_size``; ``_MOE_EP`` groups are ``range(j, tp, moe_tp_size)``,
  so ``moe_ep_rank = tp_rank // moe_tp_size`` and ``moe_tp_rank = tp_rank % moe_tp_size``;
  ``ep_size`` may be any divisor of ``tp_size``);
  ``python/sglang/srt/layers/moe/fused_moe_triton/layer.py``: ``FusedMoE`` (w13 / w2 as in
  vLLM, ``intermediate_size // moe_tp_size`` per rank, local experts
  ``moe_ep_rank * num_local_experts ...`` contiguous, ``_load_w13`` w1 then w3).
"""

from __future__ import annotations


from preset_helpers import check_table, qwen2, tensor_names
from preset_helpers import resolve as _resolve_any


def _resolve(model: dict, rollout: dict):
    return _resolve_any(model, rollout=rollout)


# ---- helpers (restructure only; no sharding arithmetic) ------------------------------------


def _check_table(ranks, table: dict, strip: str = "") -> None:
    check_table(ranks, table, strip)


def _same_as_vllm(model: dict, mesh: dict, renamed: dict[str, str]) -> None:
    """SGLang's layout equals vLLM's except local names in ``renamed`` (vllm name -> sglang name)."""
    sg = _resolve(model, {"preset": "sglang", "mesh": mesh}).rollout.ranks
    vl = _resolve(model, {"preset": "vllm", "mesh": mesh}).rollout.ranks
    assert len(sg) == len(vl)
    for s, v in zip(sg, vl):
        assert s.coords == v.coords
        want = {renamed.get(t.name, t.name): (t.shape, t.dtype, sorted(t.pieces)) for t in v.tensors}
        got = {t.name: (t.shape, t.dtype, sorted(t.pieces)) for t in s.tensors}
        assert got == want, f"rank {s.rank}"


# ---- MLA: one replicated fused down-projection named fused_qkv_a_proj_with_mqa -----------------
# tiny-deepseek-v3: q_lora_rank 32, kv_lora_rank 16 + qk_rope_head_dim 8 = 24 rows, hidden 64.
SGLANG_MLA_TP2 = {
    "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight": [
        ((56, 64), [  # rank 0
            "[0:32, 0:64] <- self_attn.q_a_proj.weight[0:32, 0:64]",
            "[32:56, 0:64] <- self_attn.kv_a_proj_with_mqa.weight[0:24, 0:64]",
        ]),
        ((56, 64), [  # rank 1 (replicated)
            "[0:32, 0:64] <- self_attn.q_a_proj.weight[0:32, 0:64]",
            "[32:56, 0:64] <- self_attn.kv_a_proj_with_mqa.weight[0:24, 0:64]",
        ]),
    ],
}


def test_sglang_mla_fused_qkv_a_proj_with_mqa() -> None:
    resolved = _resolve({"bundled": "tiny-deepseek-v3"}, {"preset": "sglang", "mesh": {"tp": 2}})
    _check_table(resolved.rollout.ranks, SGLANG_MLA_TP2, strip="model.layers.0.")
    for rank in resolved.rollout.ranks:
        names = tensor_names(rank)
        for layer in range(3):
            p = f"model.layers.{layer}.self_attn."
            assert p + "fused_qkv_a_proj_with_mqa.weight" in names
            assert p + "fused_qkv_a_proj.weight" not in names  # vLLM's name
            assert p + "q_a_proj.weight" not in names and p + "kv_a_proj_with_mqa.weight" not in names


def test_sglang_equals_vllm_elsewhere() -> None:
    fused = {
        "model.layers.0.self_attn.fused_qkv_a_proj.weight": "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight",
        "model.layers.1.self_attn.fused_qkv_a_proj.weight": "model.layers.1.self_attn.fused_qkv_a_proj_with_mqa.weight",
        "model.layers.2.self_attn.fused_qkv_a_proj.weight": "model.layers.2.self_attn.fused_qkv_a_proj_with_mqa.weight",
    }
    # vLLM 0.32 nests FusedMoE under mlp.experts.routed_experts; SGLang keeps it under mlp.experts.
    experts = {
        f"model.layers.{layer}.mlp.experts.routed_experts.{w}": f"model.layers.{layer}.mlp.experts.{w}"
        for layer in range(3)
        for w in ("w13_weight", "w2_weight")
    }
    _same_as_vllm({"bundled": "tiny-deepseek-v3"}, {"tp": 2}, {**fused, **experts})
    _same_as_vllm({"bundled": "tiny-qwen3-moe"}, {"tp": 4, "ep": 4}, experts)
    for tp in (2, 8):
        _same_as_vllm(qwen2(), {"tp": tp}, {})
    _same_as_vllm(qwen2(tied=True), {"tp": 2}, {})  # tied, pp 1: lm_head is embed_tokens, no lm_head tensor


def test_sglang_tied_embeddings_pp2_last_stage_holds_lm_head() -> None:
    # Qwen2ForCausalLM: with pp > 1 the last rank builds its own ParallelLMHead (padded to 64,
    # split over tp) and load_weights loads model.embed_tokens.weight into lm_head.weight there;
    # embed_tokens itself exists only on the first rank.
    resolved = _resolve(qwen2(tied=True, layers=2), {"preset": "sglang", "mesh": {"tp": 2, "pp": 2}})
    first = [r for r in resolved.rollout.ranks if dict(r.coords)["pp"] == 0]
    last = [r for r in resolved.rollout.ranks if dict(r.coords)["pp"] == 1]
    table = [
        ((64, 64), ["[0:64, 0:64] <- model.embed_tokens.weight[0:64, 0:64]"]),  # tp rank 0
        ((64, 64), ["[0:36, 0:64] <- model.embed_tokens.weight[64:100, 0:64]"]),  # tp rank 1
    ]
    _check_table(first, {"model.embed_tokens.weight": table})
    for rank in last:
        assert "model.embed_tokens.weight" not in tensor_names(rank)
    _check_table(last, {"lm_head.weight": table})


# ---- MoE expert parallelism smaller than tp (moe_tp_size = tp // ep) ------------------------------
# tiny-qwen3-moe at tp 4, ep 2: moe_tp 2. Rank r: moe_ep_rank r // 2 -> experts 0-3 (ranks 0, 1) or
# 4-7 (ranks 2, 3); moe_tp_rank r % 2 -> intermediate rows 0:16 or 16:32 of each expert.
SGLANG_MOE_TP4_EP2 = {
    "model.layers.0.mlp.experts.w13_weight": [
        ((4, 32, 64), [  # rank 0
            "[0:1, 0:16, 0:64] <- mlp.experts.0.gate_proj.weight[0:16, 0:64]",
            "[0:1, 16:32, 0:64] <- mlp.experts.0.up_proj.weight[0:16, 0:64]",
            "[1:2, 0:16, 0:64] <- mlp.experts.1.gate_proj.weight[0:16, 0:64]",
            "[1:2, 16:32, 0:64] <- mlp.experts.1.up_proj.weight[0:16, 0:64]",
            "[2:3, 0:16, 0:64] <- mlp.experts.2.gate_proj.weight[0:16, 0:64]",
            "[2:3, 16:32, 0:64] <- mlp.experts.2.up_proj.weight[0:16, 0:64]",
            "[3:4, 0:16, 0:64] <- mlp.experts.3.gate_proj.weight[0:16, 0:64]",
            "[3:4, 16:32, 0:64] <- mlp.experts.3.up_proj.weight[0:16, 0:64]",
        ]),
        ((4, 32, 64), [  # rank 1
            "[0:1, 0:16, 0:64] <- mlp.experts.0.gate_proj.weight[16:32, 0:64]",
            "[0:1, 16:32, 0:64] <- mlp.experts.0.up_proj.weight[16:32, 0:64]",
            "[1:2, 0:16, 0:64] <- mlp.experts.1.gate_proj.weight[16:32, 0:64]",
            "[1:2, 16:32, 0:64] <- mlp.experts.1.up_proj.weight[16:32, 0:64]",
            "[2:3, 0:16, 0:64] <- mlp.experts.2.gate_proj.weight[16:32, 0:64]",
            "[2:3, 16:32, 0:64] <- mlp.experts.2.up_proj.weight[16:32, 0:64]",
            "[3:4, 0:16, 0:64] <- mlp.experts.3.gate_proj.weight[16:32, 0:64]",
            "[3:4, 16:32, 0:64] <- mlp.experts.3.up_proj.weight[16:32, 0:64]",
        ]),
        ((4, 32, 64), [  # rank 2
            "[0:1, 0:16, 0:64] <- mlp.experts.4.gate_proj.weight[0:16, 0:64]",
            "[0:1, 16:32, 0:64] <- mlp.experts.4.up_proj.weight[0:16, 0:64]",
            "[1:2, 0:16, 0:64] <- mlp.experts.5.gate_proj.weight[0:16, 0:64]",
            "[1:2, 16:32, 0:64] <- mlp.experts.5.up_proj.weight[0:16, 0:64]",
            "[2:3, 0:16, 0:64] <- mlp.experts.6.gate_proj.weight[0:16, 0:64]",
            "[2:3, 16:32, 0:64] <- mlp.experts.6.up_proj.weight[0:16, 0:64]",
            "[3:4, 0:16, 0:64] <- mlp.experts.7.gate_proj.weight[0:16, 0:64]",
            "[3:4, 16:32, 0:64] <- mlp.experts.7.up_proj.weight[0:16, 0:64]",
        ]),
        ((4, 32, 64), [  # rank 3
            "[0:1, 0:16, 0:64] <- mlp.experts.4.gate_proj.weight[16:32, 0:64]",
            "[0:1, 16:32, 0:64] <- mlp.experts.4.up_proj.weight[16:32, 0:64]",
            "[1:2, 0:16, 0:64] <- mlp.experts.5.gate_proj.weight[16:32, 0:64]",
            "[1:2, 16:32, 0:64] <- mlp.experts.5.up_proj.weight[16:32, 0:64]",
            "[2:3, 0:16, 0:64] <- mlp.experts.6.gate_proj.weight[16:32, 0:64]",
            "[2:3, 16:32, 0:64] <- mlp.experts.6.up_proj.weight[16:32, 0:64]",
            "[3:4, 0:16, 0:64] <- mlp.experts.7.gate_proj.weight[16:32, 0:64]",
            "[3:4, 16:32, 0:64] <- mlp.experts.7.up_proj.weight[16:32, 0:64]",
        ]),
    ],
    "model.layers.0.mlp.experts.w2_weight": [
        ((4, 64, 16), [  # rank 0
            "[0:1, 0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 0:16]",
            "[1:2, 0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 0:16]",
            "[2:3, 0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 0:16]",
            "[3:4, 0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 0:16]",
        ]),
        ((4, 64, 16), [  # rank 1
            "[0:1, 0:64, 0:16] <- mlp.experts.0.down_proj.weight[0:64, 16:32]",
            "[1:2, 0:64, 0:16] <- mlp.experts.1.down_proj.weight[0:64, 16:32]",
            "[2:3, 0:64, 0:16] <- mlp.experts.2.down_proj.weight[0:64, 16:32]",
            "[3:4, 0:64, 0:16] <- mlp.experts.3.down_proj.weight[0:64, 16:32]",
        ]),
        ((4, 64, 16), [  # rank 2
            "[0:1, 0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 0:16]",
            "[1:2, 0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 0:16]",
            "[2:3, 0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 0:16]",
            "[3:4, 0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 0:16]",
        ]),
        ((4, 64, 16), [  # rank 3
            "[0:1, 0:64, 0:16] <- mlp.experts.4.down_proj.weight[0:64, 16:32]",
            "[1:2, 0:64, 0:16] <- mlp.experts.5.down_proj.weight[0:64, 16:32]",
            "[2:3, 0:64, 0:16] <- mlp.experts.6.down_proj.weight[0:64, 16:32]",
            "[3:4, 0:64, 0:16] <- mlp.experts.7.down_proj.weight[0:64, 16:32]",
        ]),
    ],
}


def test_sglang_moe_ep_smaller_than_tp() -> None:
    resolved = _resolve({"bundled": "tiny-qwen3-moe"}, {"preset": "sglang", "mesh": {"tp": 4, "ep": 2}})
    _check_table(resolved.rollout.ranks, SGLANG_MOE_TP4_EP2, strip="model.layers.0.")


# ---- SGLang's CPU engine (cpu_pad: true) -------------------------------------------------------
# python/sglang/srt/configs/update_config.py: adjust_config_with_unaligned_cpu_tp pads
# moe_intermediate_size / intermediate_size to a multiple of tp * DEFAULT_MOE_PADDING_SIZE (32) when
# they do not divide: tiny-qwen3-moe-vllm's 32 becomes 64 at TP 2, 32 rows per rank, so rank 0 holds
# the real rows and rank 1 only zeros (what an integrator found: "TP rank 1 held only zeros").
SGLANG_CPU_MOE_TP2 = {
    "model.layers.0.mlp.experts.w13_weight": [
        ((8, 64, 64), [f"[{e}:{e + 1}, 0:32, 0:64] <- mlp.experts.{e}.gate_proj.weight[0:32, 0:64]" for e in range(8)]
         + [f"[{e}:{e + 1}, 32:64, 0:64] <- mlp.experts.{e}.up_proj.weight[0:32, 0:64]" for e in range(8)]),
        ((8, 64, 64), []),  # rank 1: padding only
    ],
    "model.layers.0.mlp.experts.w2_weight": [
        ((8, 64, 32), [f"[{e}:{e + 1}, 0:64, 0:32] <- mlp.experts.{e}.down_proj.weight[0:64, 0:32]" for e in range(8)]),
        ((8, 64, 32), []),
    ],
}


def test_sglang_cpu_pad_pads_the_moe_intermediate_size_to_tp_times_32() -> None:
    model = {"bundled": "tiny-qwen3-moe-vllm"}
    resolved = _resolve(model, {"preset": "sglang", "mesh": {"tp": 2}, "params": {"cpu_pad": True}})
    _check_table(resolved.rollout.ranks, SGLANG_CPU_MOE_TP2, strip="model.layers.0.")
    # sizes that divide (tiny-qwen2-vllm: intermediate 256 at TP 2) are not padded: the GPU layout
    dense = {"bundled": "tiny-qwen2-vllm"}
    plain = _resolve(dense, {"preset": "sglang", "mesh": {"tp": 2}}).rollout.ranks
    assert _resolve(dense, {"preset": "sglang", "mesh": {"tp": 2}, "params": {"cpu_pad": True}}).rollout.ranks == plain
