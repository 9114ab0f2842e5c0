"""The trainer side for the vLLM integration's conformance run: an FSDP2 (dp 2, float32) HF model.

The model is the checkpoint the spec's ``model.config`` points at (the bundled
``tiny-qwen2-vllm``, written by ``conftest.py``), built as ``weightbridge.integrations.vllm.selfcheck``'s
``trainer_main`` builds it (transformers' model, ``fully_shard`` per layer and on the whole model);
the rollout side is :mod:`weightbridge.integrations.vllm.conformance` (a real ``vllm.LLM``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from weightbridge.bridge import TrainerBridge


class QwenFSDP2TrainerRank:
    """One FSDP2 trainer rank (transformers' model, DTensor shards on dp)."""

    def __init__(self, ctx) -> None:
        import yaml
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoConfig, AutoModelForCausalLM

        ctx.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("dp",))
        model_dir = Path(yaml.safe_load(Path(ctx.spec_path).read_text())["model"]["config"]).parent
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.params = dict(model.named_parameters())  # a tied lm_head is the embedding (de-duplicated)
        self.bridge = TrainerBridge.from_spec(ctx.spec_path, rank=ctx.rank, tensors=self.tensors(),
                                              **ctx.bridge_kwargs())

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return {name: p.to_local() for name, p in self.params.items()}

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full HF tensors -> this rank's FSDP2 shards (DTensor's own chunking, no communication)."""
        from torch.distributed.tensor import distribute_tensor

        for name, full in weights:
            p = self.params[name]
            shard = distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(shard.to_local())

    def push(self, version: int):
        return self.bridge.push(version, tensors=self.tensors())

    def close(self) -> None:
        import torch.distributed as dist

        self.bridge.close()
        dist.destroy_process_group()
