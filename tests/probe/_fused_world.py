"""A real FSDP2 rank holding a transformers 5 Qwen3-MoE on a CPU Gloo world (run by
test_fused_live.py through ``launch``).

The model is ``Qwen3MoeForCausalLM`` built from a config (transformers keeps each layer's experts
fused: ``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``), then
``fully_shard`` per layer and at the root on a ``dp`` mesh. The rank returns its layout IR read
from the DTensors with the fused parameters described by transformers' conversion mapping, and
the replay of that IR from the checkpoint-format tensors transformers' own
``revert_weight_conversion`` gives (what ``save_pretrained`` writes) against ``to_local()``.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def tiny_config():
    from transformers import Qwen3MoeConfig

    # 2 layers, 4 experts, hidden 64; vocab 130 is uneven over dp 3 (the in-process test)
    return Qwen3MoeConfig(vocab_size=130, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """The model's weights in checkpoint format, by transformers' own reverse conversion."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, {n: p.detach().clone() for n, p in model.named_parameters()})


def run_rank(rank: int, store: str, dp: int, config_dir: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    from weightbridge.probe.dtensor import layout_from_dtensors
    from weightbridge.probe.fused import fused_params
    from weightbridge.tensors import diff_tensors, materialize

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=dp,
                            timeout=timedelta(seconds=30))
    try:
        mesh = init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",))
        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(AutoConfig.from_pretrained(config_dir))
        full = checkpoint_tensors(model)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = dict(model.named_parameters())
        fused = fused_params(model.config.model_type, {n: p.shape for n, p in params.items()})
        layout = layout_from_dtensors(params, fused=fused)
        local = {n: p.to_local().detach() for n, p in params.items()}
        return {
            "layout": layout.to_json(),
            "fused": sorted(fused),
            "replay": diff_tensors(materialize(layout, full), local),
            "placements": sorted({repr(tuple(p.placements)) for p in params.values()}),
        }
    finally:
        dist.destroy_process_group()
