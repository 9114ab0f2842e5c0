"""A real FSDP2 + TP rank on a CPU Gloo world (run by test_dtensor.py through ``launch``).

A small HF-named module (no transformers import: it only needs the parameter names and
shapes of a Llama/Qwen2 decoder) gets torch's own TP plan on ``tp`` and FSDP2
``fully_shard`` on ``dp``; :func:`layout_from_dtensors` of its parameters must equal the
fsdp2 preset's expansion, and replaying the IR from the full weights must give
``to_local()`` bitwise.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from weightbridge.canonical.inline import from_inline

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


class RMSNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Attn(nn.Module):
    def __init__(self, h: int, q: int, kv: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(h, q, bias=True)
        self.k_proj = nn.Linear(h, kv, bias=True)
        self.v_proj = nn.Linear(h, kv, bias=True)
        self.o_proj = nn.Linear(q, h, bias=False)


class Mlp(nn.Module):
    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)


class Layer(nn.Module):
    def __init__(self, h: int, q: int, kv: int, i: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(h)
        self.self_attn = Attn(h, q, kv)
        self.post_attention_layernorm = RMSNorm(h)
        self.mlp = Mlp(h, i)


class Inner(nn.Module):
    def __init__(self, v: int, h: int, q: int, kv: int, i: int, layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(v, h)
        self.layers = nn.ModuleList([Layer(h, q, kv, i) for _ in range(layers)])
        self.norm = RMSNorm(h)


class TinyLM(nn.Module):
    def __init__(self, v=36, h=10, q=16, kv=8, i=20, layers=2) -> None:
        super().__init__()
        self.model = Inner(v, h, q, kv, i, layers)
        self.lm_head = nn.Linear(h, v, bias=False)


def canonical_of(module: nn.Module):
    return from_inline(
        [{"name": n, "shape": list(p.shape), "dtype": "float32"} for n, p in module.named_parameters()],
        {"num_heads": 4, "num_kv_heads": 2, "head_dim": 4, "tie_word_embeddings": False},
    )


def run_rank(rank: int, store: str, dp: int, tp: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from weightbridge.probe.diff import diff_layouts, format_diff
    from weightbridge.probe.dtensor import layout_from_dtensors
    from weightbridge.tensors import diff_tensors, materialize

    from ._zoo import expand

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=dp * tp, timeout=timedelta(seconds=30)
    )
    try:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = TinyLM()
        full = {k: v.detach().clone() for k, v in model.named_parameters()}
        canonical = canonical_of(model)
        plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()), "lm_head": ColwiseParallel()}
        for i in range(len(model.model.layers)):
            plan.update({f"model.layers.{i}.{n}": ColwiseParallel() for n in COLWISE})
            plan.update({f"model.layers.{i}.{n}": RowwiseParallel() for n in ROWWISE})
        parallelize_module(model, mesh["tp"], plan)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        params = dict(model.named_parameters())
        layout = layout_from_dtensors(params)
        want = expand("fsdp2", {"dp": dp, "tp": tp}, canonical, side="trainer").ranks[rank]
        local = {n: p.to_local().detach() for n, p in params.items()}
        return {
            "diff": format_diff(diff_layouts(layout, want, strict=True)),
            "replay": diff_tensors(materialize(layout, full), local),
            "placements": sorted({repr(tuple(p.placements)) for p in params.values()}),
            "coords": dict(layout.coords),
        }
    finally:
        dist.destroy_process_group()
