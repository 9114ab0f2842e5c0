"""This rank's trainer layout IR from a live Megatron-Core ``GPTModel`` (reads, never moves data).

Frames: *local* = a parameter of the rank's ``GPTModel`` by its ``named_parameters()`` name
(``decoder.layers.0.self_attention.linear_qkv.weight``, stage-local layer numbers, local experts,
the TP/expert-TP shard's shape); *canonical* = the HuggingFace checkpoint tensor it holds a box of
(``model.layers.2.self_attn.q_proj.weight``, full shape). Called on every trainer rank after
``parallel_state.initialize_model_parallel`` and the model build; it reads

* the rank's coordinates from ``parallel_state`` (TP, expert-TP, EP, PP, DP ranks);
* each layer's global index from ``TransformerLayer.layer_number`` (1-based, pipeline offset
  included), each MoE layer's global expert ids from ``MoELayer.local_expert_indices``, the
  vocabulary shard from ``VocabParallelEmbedding.vocab_start_index``;
* the attention geometry (query groups, heads, ``kv_channels``) from the layer's
  ``TransformerConfig``; each TP-sharded parameter's ``partition_dim`` (checked, not guessed).

Layouts covered: column-parallel (rows over TP) ``linear_qkv`` interleaved per query group
``[q_g; k_g; v_g]`` with its bias, ``linear_fc1`` = ``[gate; up]`` each split over TP, row-parallel
``linear_proj`` / ``linear_fc2`` (columns over TP), the padded vocabulary over TP (padding rows
map to nothing), tied embeddings (the last stage's ``output_layer.weight`` copy when PP > 1),
router (replicated), ``router.expert_bias`` (a buffer), experts as ``SequentialMLP``
(``experts.local_experts.{j}``) or ``TEGroupedMLP`` (``experts.linear_fc1.weight{j}``) split over
expert-TP, shared experts; norms of the local layer spec (``input_layernorm``,
``pre_mlp_layernorm``) and of the Transformer Engine spec (fused ``layer_norm_weight``).
``*._extra_state`` entries are not weights and are skipped. Anything else raises
:class:`UnsupportedParameter` naming it (``skip=`` to leave parameters out on purpose).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from weightbridge.layout.ir import LocalTensor, Piece, RankLayout
from weightbridge.tensors import dtype_name

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
SEQ_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight$")
GROUPED_EXPERT = re.compile(r"^mlp\.experts\.linear_fc([12])\.weight(\d+)$")

# Replicated per-layer tensors: local suffix -> canonical suffix (under model.layers.{layer}.).
LAYER_REPLICATED = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",
}
ROW_PARALLEL = {  # split on dim 1 over TP
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
}
GATE_UP = {  # [gate; up], each split on dim 0 over TP
    "mlp.linear_fc1.weight": "mlp.{}_proj.weight",
    "mlp.shared_experts.linear_fc1.weight": "mlp.shared_experts.{}_proj.weight",
}
BUFFERS = ("mlp.router.expert_bias",)


class UnsupportedParameter(ValueError):
    """A Megatron parameter this introspection has no canonical mapping for (named in the message)."""


def _unwrap(model: Any) -> Any:
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise UnsupportedParameter(f"{len(model)} model chunks: virtual pipeline stages are not supported")
        model = model[0]
    while hasattr(model, "module") and not hasattr(model, "decoder"):  # DDP / Float16Module wrappers
        model = model.module
    return model


def _ps() -> Any:
    from megatron.core import parallel_state

    return parallel_state


def rank_coords() -> dict[str, int]:
    """This rank's Megatron coordinates (tp, cp, dp, pp, ep, etp, edp) from ``parallel_state``."""
    ps = _ps()
    return {
        "tp": ps.get_tensor_model_parallel_rank(), "cp": ps.get_context_parallel_rank(),
        "dp": ps.get_data_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
        "ep": ps.get_expert_model_parallel_rank(), "etp": ps.get_expert_tensor_parallel_rank(),
        "edp": ps.get_expert_data_parallel_rank(),
    }


def mesh_from_parallel_state() -> dict[str, int]:
    """The running world's sizes as a spec's ``trainer.mesh`` (``preset: megatron``); any rank may call."""
    ps = _ps()
    return {
        "tp": ps.get_tensor_model_parallel_world_size(), "cp": ps.get_context_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(), "pp": ps.get_pipeline_model_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(), "etp": ps.get_expert_tensor_parallel_world_size(),
    }


def megatron_tensors(model: Any) -> dict[str, Any]:
    """The rank's live tensors by local name (parameters, plus ``router.expert_bias`` buffers)."""
    m = _unwrap(model)
    out = {n: p for n, p in m.named_parameters()}
    out.update({n: b for n, b in m.named_buffers() if n.endswith(BUFFERS)})
    return {n: t for n, t in out.items() if not n.endswith("_extra_state")}


def _full(shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((0, n) for n in shape)


def _rows(canon: str, c0: int, l0: int, n: int, shape: tuple[int, ...]) -> Piece:
    """Rows ``[c0, c0+n)`` of ``canon`` stored in local rows ``[l0, l0+n)``; other dims whole."""
    rest = _full(shape[1:])
    return Piece(canon, ((c0, c0 + n),) + rest, ((l0, l0 + n),) + rest, False)


def _check_dim(name: str, param: Any, dim: int, size: int) -> None:
    if size > 1 and getattr(param, "tensor_model_parallel", False) and getattr(param, "partition_dim", dim) != dim:
        raise UnsupportedParameter(f"{name}: partition_dim {param.partition_dim}, expected {dim}")


class _Rank:
    """Per-rank facts the mapping needs."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        ps = _ps()
        self.model = model
        self.vocab = vocab_size
        self.tp, self.tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        self.etp = ps.get_expert_tensor_parallel_world_size()
        self.etp_rank = ps.get_expert_tensor_parallel_rank()
        self.tied = bool(getattr(model, "share_embeddings_and_output_weights", False))

    def pieces(self, name: str, param: Any) -> tuple[Piece, ...]:
        shape = tuple(param.shape)
        if name == "embedding.word_embeddings.weight":
            emb = self.model.embedding.word_embeddings
            return self._vocab("model.embed_tokens.weight", int(emb.vocab_start_index), shape)
        if name == "output_layer.weight":
            _check_dim(name, param, 0, self.tp)
            canon = "model.embed_tokens.weight" if self.tied else "lm_head.weight"
            return self._vocab(canon, self.tp_rank * shape[0], shape)
        if name == "decoder.final_layernorm.weight":
            return (Piece("model.norm.weight", _full(shape), _full(shape), False),)
        m = LAYER.match(name)
        if m is None:
            raise UnsupportedParameter(f"{name}: not a Megatron GPTModel weight this introspection maps")
        layer = self.model.decoder.layers[int(m.group(1))]
        return self._layer(name, m.group(2), layer, layer.layer_number - 1, param, shape)

    def _vocab(self, canon: str, start: int, shape: tuple[int, ...]) -> tuple[Piece, ...]:
        n = min(start + shape[0], self.vocab) - start
        return (_rows(canon, start, 0, n, shape),) if n > 0 else ()

    def _layer(self, name: str, sub: str, layer: Any, g: int, param: Any, shape: tuple[int, ...]) -> tuple[Piece, ...]:
        pre = f"model.layers.{g}."
        if sub in LAYER_REPLICATED:
            return (Piece(pre + LAYER_REPLICATED[sub], _full(shape), _full(shape), False),)
        if sub in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            _check_dim(name, param, 0, self.tp)
            return self._qkv(name, pre, sub.rsplit(".", 1)[1], layer.self_attention.config, shape)
        if sub in ROW_PARALLEL:
            _check_dim(name, param, 1, self.tp)
            return (self._cols(pre + ROW_PARALLEL[sub], self.tp_rank, shape),)
        if sub in GATE_UP:
            _check_dim(name, param, 0, self.tp)
            return self._gate_up(pre + GATE_UP[sub], self.tp_rank, shape)
        e = SEQ_EXPERT.match(sub)
        j, fc = (int(e.group(1)), e.group(2)) if e else (None, None)
        e = GROUPED_EXPERT.match(sub)
        if e:
            j, fc = int(e.group(2)), e.group(1)
        if j is not None:
            expert = layer.mlp.local_expert_indices[j]
            base = f"{pre}mlp.experts.{expert}."
            if fc == "1":
                return self._gate_up(base + "{}_proj.weight", self.etp_rank, shape)
            return (self._cols(base + "down_proj.weight", self.etp_rank, shape),)
        raise UnsupportedParameter(f"{name}: no canonical mapping for decoder layer tensor {sub!r}")

    @staticmethod
    def _cols(canon: str, r: int, shape: tuple[int, ...]) -> Piece:
        n = shape[1]
        return Piece(canon, ((0, shape[0]), (r * n, (r + 1) * n)) + _full(shape[2:]), _full(shape), False)

    @staticmethod
    def _gate_up(template: str, r: int, shape: tuple[int, ...]) -> tuple[Piece, ...]:
        half = shape[0] // 2
        return (_rows(template.format("gate"), r * half, 0, half, shape),
                _rows(template.format("up"), r * half, half, half, shape))

    def _qkv(self, name: str, pre: str, kind: str, cfg: Any, shape: tuple[int, ...]) -> tuple[Piece, ...]:
        groups, heads, d = cfg.num_query_groups or cfg.num_attention_heads, cfg.num_attention_heads, cfg.kv_channels
        if groups % self.tp:
            raise UnsupportedParameter(f"{name}: {groups} query groups do not split over tp={self.tp}")
        local_groups, q_rows = groups // self.tp, heads // groups * d
        per_group = q_rows + 2 * d
        if shape[0] != local_groups * per_group:
            raise UnsupportedParameter(f"{name}: {shape[0]} rows, expected {local_groups} groups x {per_group}")
        out = []
        for gl in range(local_groups):
            grp, base = self.tp_rank * local_groups + gl, gl * per_group
            out.append(_rows(f"{pre}self_attn.q_proj.{kind}", grp * q_rows, base, q_rows, shape))
            out.append(_rows(f"{pre}self_attn.k_proj.{kind}", grp * d, base + q_rows, d, shape))
            out.append(_rows(f"{pre}self_attn.v_proj.{kind}", grp * d, base + q_rows + d, d, shape))
        return tuple(out)


def layout_from_megatron(
    model: Any,
    *,
    vocab_size: int,
    rank: int | None = None,
    side: str = "trainer",
    skip: Callable[[str], bool] | None = None,
) -> RankLayout:
    """This rank's layout IR from its built ``GPTModel`` (or a one-element list / wrapped model).

    ``vocab_size``: the HF (unpadded) vocabulary; rows past it are Megatron's vocabulary padding.
    ``rank``: this rank in the trainer side's numbering (default: the default group's rank, which
    is Megatron's global rank). Local tensor names and order are those of
    :func:`megatron_tensors`. Reads only; every rank calls it for itself.
    """
    m = _unwrap(model)
    if rank is None:
        import torch

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    facts = _Rank(m, vocab_size)
    tensors = []
    for name, t in megatron_tensors(m).items():
        if skip is not None and skip(name):
            continue
        tensors.append(LocalTensor(name, tuple(t.shape), dtype_name(t.dtype), facts.pieces(name, t)))
    coords = rank_coords()
    return RankLayout(side=side, rank=rank, tensors=tuple(tensors), instance=0, local_rank=rank,
                      coords=tuple(sorted(coords.items())))
