"""Synthetic layout pairs for benchmarks and tests (no spec files needed).

:func:`moe_layouts` builds a DeepSeek-V3-shaped pair: a Megatron-like trainer with PP x EP
ranks (dense tensors replicated over the EP ranks of a stage, experts fused ``fc1 = [gate; up]``)
and vLLM-like rollout instances of TP x EP ranks (dense tensors TP-sharded, experts in
``w13 [E_local, 2I, H]`` / ``w2 [E_local, H, I]``). Defaults give the real DeepSeek-V3 sizes.
"""

from __future__ import annotations

from weightbridge.layout.box import full_box
from weightbridge.layout.ir import LocalTensor, Piece, RankLayout, SideLayout


def _shard(n: int, k: int, i: int) -> tuple[int, int]:
    return (n * i // k, n * (i + 1) // k)


def moe_layouts(
    *,
    num_layers: int = 61,
    num_dense: int = 3,
    num_experts: int = 256,
    hidden: int = 7168,
    inter: int = 2048,
    dense_inter: int = 18432,
    vocab: int = 129280,
    pp: int = 16,
    ep: int = 16,
    dp: int = 1,
    instances: int = 16,
    rollout_tp: int = 8,
    dtype: str = "bfloat16",
    trainer_dtype: str | None = None,
    share_instances: bool = True,
) -> tuple[SideLayout, SideLayout]:
    """(trainer, rollout) layouts: Megatron PP x EP (x DP replicas) -> ``instances`` x vLLM TP=EP. ``share_instances``
    reuses one instance's tensor objects."""
    H, I, E = hidden, inter, num_experts
    tdt = trainer_dtype or dtype
    attn = {  # name -> (shape, rollout TP dim or None)
        "self_attn.q_a_proj.weight": ((1536, H), None),
        "self_attn.q_a_layernorm.weight": ((1536,), None),
        "self_attn.q_b_proj.weight": ((24576, 1536), 0),
        "self_attn.kv_a_proj_with_mqa.weight": ((576, H), None),
        "self_attn.kv_a_layernorm.weight": ((512,), None),
        "self_attn.kv_b_proj.weight": ((32768, 512), 0),
        "self_attn.o_proj.weight": ((H, 16384), 1),
        "input_layernorm.weight": ((H,), None),
        "post_attention_layernorm.weight": ((H,), None),
    }

    def dense_of(layer: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
        d = {f"model.layers.{layer}.{k}": v for k, v in attn.items()}
        p = f"model.layers.{layer}.mlp"
        if layer < num_dense:
            d[f"{p}.gate_proj.weight"] = ((dense_inter, H), 0)
            d[f"{p}.up_proj.weight"] = ((dense_inter, H), 0)
            d[f"{p}.down_proj.weight"] = ((H, dense_inter), 1)
        else:
            d[f"{p}.gate.weight"] = ((E, H), None)
            d[f"{p}.gate.e_score_correction_bias"] = ((E,), None)
            d[f"{p}.shared_experts.gate_proj.weight"] = ((I, H), 0)
            d[f"{p}.shared_experts.up_proj.weight"] = ((I, H), 0)
            d[f"{p}.shared_experts.down_proj.weight"] = ((H, I), 1)
        return d

    # ---- trainer: rank = stage * ep + e ----
    stages = [[] for _ in range(pp)]
    for layer in range(num_layers):
        stages[layer * pp // num_layers].append(layer)
    trainer_ranks = []
    e_per = E // ep
    for st in range(pp):
        dense_t: list[LocalTensor] = []
        if st == 0:
            dense_t.append(_whole("embedding.word_embeddings.weight", "model.embed_tokens.weight", (vocab, H), tdt))
        for j, layer in enumerate(stages[st]):
            for name, (shape, _) in dense_of(layer).items():
                dense_t.append(_whole(f"decoder.layers.{j}.{name.split('.', 3)[3]}", name, shape, tdt))
        if st == pp - 1:
            dense_t.append(_whole("decoder.final_layernorm.weight", "model.norm.weight", (H,), tdt))
            dense_t.append(_whole("output_layer.weight", "lm_head.weight", (vocab, H), tdt))
        for e_rank in range(ep):
            ts = list(dense_t)
            for j, layer in enumerate(stages[st]):
                if layer < num_dense:
                    continue
                p = f"model.layers.{layer}.mlp.experts"
                for x in range(e_per):
                    e = e_rank * e_per + x
                    ts.append(LocalTensor(f"decoder.layers.{j}.mlp.experts.linear_fc1.weight{x}", (2 * I, H), tdt, (
                        Piece(f"{p}.{e}.gate_proj.weight", full_box((I, H)), ((0, I), (0, H))),
                        Piece(f"{p}.{e}.up_proj.weight", full_box((I, H)), ((I, 2 * I), (0, H))),
                    )))
                    ts.append(_whole(f"decoder.layers.{j}.mlp.experts.linear_fc2.weight{x}",
                                     f"{p}.{e}.down_proj.weight", (H, I), tdt))
            trainer_ranks.append(RankLayout("trainer", st * ep + e_rank, tuple(ts),
                                            coords=(("ep", e_rank), ("pp", st))))
    # data-parallel replicas (rank = d * pp * ep + stage * ep + e), sharing the tensor objects
    trainer_ranks += [RankLayout("trainer", d * pp * ep + lay.rank, lay.tensors, coords=tuple(sorted((*lay.coords, ("dp", d)))))
                      for d in range(1, dp) for lay in trainer_ranks[:pp * ep]]
    trainer = SideLayout("trainer", tuple(trainer_ranks))

    # ---- rollout: one instance, TP = EP = rollout_tp ----
    tp = rollout_tp
    el = E // tp
    inst0: list[tuple[LocalTensor, ...]] = []
    for r in range(tp):
        ts = []
        v0, v1 = _shard(vocab, tp, r)
        ts.append(LocalTensor("model.embed_tokens.weight", (v1 - v0, H), dtype,
                              (Piece("model.embed_tokens.weight", ((v0, v1), (0, H)), ((0, v1 - v0), (0, H))),)))
        for layer in range(num_layers):
            for name, (shape, dim) in dense_of(layer).items():
                ts.append(_tp(name, shape, dim, tp, r, dtype))
            if layer < num_dense:
                continue
            p = f"model.layers.{layer}.mlp.experts"
            w13, w2 = [], []
            for x in range(el):
                e = r * el + x
                w13.append(Piece(f"{p}.{e}.gate_proj.weight", full_box((I, H)), ((x, x + 1), (0, I), (0, H))))
                w13.append(Piece(f"{p}.{e}.up_proj.weight", full_box((I, H)), ((x, x + 1), (I, 2 * I), (0, H))))
                w2.append(Piece(f"{p}.{e}.down_proj.weight", full_box((H, I)), ((x, x + 1), (0, H), (0, I))))
            ts.append(LocalTensor(f"model.layers.{layer}.mlp.experts.routed_experts.w13_weight", (el, 2 * I, H), dtype, tuple(w13)))
            ts.append(LocalTensor(f"model.layers.{layer}.mlp.experts.routed_experts.w2_weight", (el, H, I), dtype, tuple(w2)))
        ts.append(_tp("model.norm.weight", (H,), None, tp, r, dtype))
        ts.append(_tp("lm_head.weight", (vocab, H), 0, tp, r, dtype))
        inst0.append(tuple(ts))
    ranks = []
    for i in range(instances):
        for r in range(tp):
            ts = inst0[r] if share_instances or i == 0 else tuple(_copy(t) for t in inst0[r])
            ranks.append(RankLayout("rollout", i * tp + r, ts, instance=i, local_rank=r,
                                    coords=(("tp", r),)))
    rollout = SideLayout("rollout", tuple(ranks), num_instances=instances)
    return trainer, rollout


def _whole(local: str, canonical: str, shape: tuple[int, ...], dtype: str) -> LocalTensor:
    return LocalTensor(local, shape, dtype, (Piece(canonical, full_box(shape), full_box(shape)),))


def _tp(name: str, shape: tuple[int, ...], dim: int | None, tp: int, r: int, dtype: str) -> LocalTensor:
    if dim is None:
        return _whole(name, name, shape, dtype)
    a, b = _shard(shape[dim], tp, r)
    cbox = tuple((a, b) if d == dim else (0, n) for d, n in enumerate(shape))
    lshape = tuple(b - a if d == dim else n for d, n in enumerate(shape))
    return LocalTensor(name, lshape, dtype, (Piece(name, cbox, full_box(lshape)),))


def _copy(t: LocalTensor) -> LocalTensor:
    return LocalTensor(str(t.name), tuple(t.shape), str(t.dtype), tuple(
        Piece(p.canonical, tuple(tuple(iv) for iv in p.canonical_box), tuple(tuple(iv) for iv in p.local_box),
              p.transpose) for p in t.pieces))
