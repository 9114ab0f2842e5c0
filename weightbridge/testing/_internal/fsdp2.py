"""An FSDP2 trainer rank as a conformance-suite ``wb_trainer`` factory (weightbridge's own suites).

:class:`FSDP2TrainerRank` runs :class:`~weightbridge.demo.fsdp2.FSDP2World` inside a suite rank
process; a suite subclasses it and overrides :meth:`~FSDP2TrainerRank.build_model`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from weightbridge.demo.fsdp2 import FSDP2World


class FSDP2TrainerRank:
    """A :class:`~weightbridge.testing.TrainerRank`: its own Gloo world, a dp mesh, FSDP2 shards."""

    def __init__(self, ctx: Any) -> None:
        from weightbridge.bridge import TrainerBridge

        ctx.init_process_group("gloo")
        self.world = FSDP2World(lambda mesh: self.build_model(ctx, mesh), rank=ctx.rank, world_size=ctx.world_size)
        self.params = self.world.params
        self.bridge = TrainerBridge.from_spec(ctx.spec_path, rank=ctx.rank, tensors=self.tensors(),
                                              **ctx.bridge_kwargs())

    def build_model(self, ctx: Any, mesh: Any) -> torch.nn.Module:
        """The model, already ``fully_shard``-ed over ``mesh`` (override)."""
        raise NotImplementedError

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self.world.tensors()

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
        self.bridge.close()
        self.world.close()
