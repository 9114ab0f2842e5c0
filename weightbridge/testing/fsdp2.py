"""A ready-made trainer side for conformance runs: one FSDP2 rank of a transformers model.

Integrations whose trainer is FSDP2 (``fully_shard`` over a dp mesh, DTensor parameters named as
in the HF checkpoint) can use :class:`FSDP2TrainerRank` as their ``wb_trainer`` factory after
overriding :meth:`build_model`. Runs inside a suite rank process (imports torch.distributed lazily).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


class FSDP2TrainerRank:
    """A :class:`~weightbridge.testing.TrainerRank`: its own Gloo world, a dp mesh, FSDP2 shards."""

    def __init__(self, ctx: Any) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from weightbridge.bridge import TrainerBridge

        ctx.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("dp",))
        self.params = dict(self.build_model(ctx, mesh).named_parameters())  # a tied lm_head is de-duplicated
        self.bridge = TrainerBridge.from_spec(ctx.spec_path, rank=ctx.rank, tensors=self.tensors(),
                                              **ctx.bridge_kwargs())

    def build_model(self, ctx: Any, mesh: Any) -> torch.nn.Module:
        """The model, already ``fully_shard``-ed over ``mesh`` (override)."""
        raise NotImplementedError

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

    def push(self, version: int) -> Any:
        return self.bridge.push(version, tensors=self.tensors())

    def close(self) -> None:
        import torch.distributed as dist

        self.bridge.close()
        dist.destroy_process_group()
