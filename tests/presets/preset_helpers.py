"""Shared helpers of the preset table tests: restructure IR into strings, never compute boxes."""

from __future__ import annotations

import json

from weightbridge.spec.resolve import check_text

QWEN2_PARAMS = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 8}


def box_str(box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def tensor_names(rank) -> set[str]:
    return {t.name for t in rank.tensors}


def view(rank, local: str, strip: str = "") -> tuple[tuple[int, ...], list[str]]:
    """(shape, sorted 'local box <- canonical[box]' strings) of one local tensor; ``strip`` shortens names."""
    t = rank.tensor(local)
    pieces = []
    for p in t.pieces:
        name = p.canonical[len(strip) :] if strip and p.canonical.startswith(strip) else p.canonical
        pieces.append(f"{box_str(p.local_box)} <- {name}{box_str(p.canonical_box)}" + (".T" if p.transpose else ""))
    return tuple(t.shape), sorted(pieces)


def check_table(ranks, table: dict, strip: str = "") -> None:
    """``table``: full local name -> one (shape, pieces) entry per rank, in rank order."""
    for local, per_rank in table.items():
        assert len(per_rank) == len(ranks), local
        for rank, (shape, pieces) in zip(ranks, per_rank):
            assert local in tensor_names(rank), f"rank {rank.rank} holds no {local}; it holds {sorted(tensor_names(rank))}"
            assert view(rank, local, strip) == (tuple(shape), sorted(pieces)), f"{local} on rank {rank.rank}"


def resolve(model: dict, *, trainer: dict | None = None, rollout: dict | None = None):
    """Resolve a spec of ``model`` (inline or bundled) with the given sides (default: hf)."""
    text = "\n".join(
        [
            "version: 1",
            f"model: {json.dumps(model)}",
            f"trainer: {json.dumps(trainer or {'preset': 'hf'})}",
            f"rollout: {json.dumps(rollout or {'preset': 'hf'})}",
        ]
    )
    resolved, problems = check_text(text)
    assert problems == [], [str(p) for p in problems]
    return resolved


def qwen2(vocab: int = 100, tied: bool = False, layers: int = 1) -> dict:
    """A Qwen2-style model: hidden 64, 8 heads / 2 kv heads of 8, intermediate 96, q/k/v biases."""
    t = [("model.embed_tokens.weight", [vocab, 64]), ("model.norm.weight", [64])]
    if not tied:
        t.append(("lm_head.weight", [vocab, 64]))
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t += [
            (p + "input_layernorm.weight", [64]),
            (p + "post_attention_layernorm.weight", [64]),
            (p + "self_attn.q_proj.weight", [64, 64]),
            (p + "self_attn.q_proj.bias", [64]),
            (p + "self_attn.k_proj.weight", [16, 64]),
            (p + "self_attn.k_proj.bias", [16]),
            (p + "self_attn.v_proj.weight", [16, 64]),
            (p + "self_attn.v_proj.bias", [16]),
            (p + "self_attn.o_proj.weight", [64, 64]),
            (p + "mlp.gate_proj.weight", [96, 64]),
            (p + "mlp.up_proj.weight", [96, 64]),
            (p + "mlp.down_proj.weight", [64, 96]),
        ]
    return {
        "tensors": [{"name": n, "shape": s, "dtype": "bfloat16"} for n, s in t],
        "params": {**QWEN2_PARAMS, "tie_word_embeddings": tied},
    }
