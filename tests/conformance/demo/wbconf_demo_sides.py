"""The demo's reference integration (weightbridge/demo) as conformance-suite sides.

Trainer rank: the demo's FSDP2 model (``build_fsdp2_model``) in its own Gloo world, pushing the
DTensor local shards as ``weightbridge.demo.workers.trainer_main`` does. Rollout rank: the demo's
vLLM-style rank as ``rollout_main`` builds it (live tensors in the spec's layout; in place in sync
mode, staged in async mode). Called inside the suite's rank processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from weightbridge.bridge import RolloutBridge, TrainerBridge
from weightbridge.transport.localrun import empty_like_layout


class DemoTrainerRank:
    """One FSDP2 trainer rank of the demo (float32 master weights, sharded on dp)."""

    def __init__(self, ctx) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from weightbridge.demo.model import build_fsdp2_model

        ctx.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("dp",))
        self.params = dict(build_fsdp2_model(mesh).named_parameters())
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


class DemoRolloutRank:
    """One vLLM-style TP rank of the demo; it has no loader of its own (see the known gap)."""

    def __init__(self, ctx) -> None:
        resolved = ctx.resolved()
        self.rank = ctx.rank
        self.live = empty_like_layout(resolved.rollout.ranks[ctx.rank])
        self.bridge = RolloutBridge.from_spec(resolved, rank=ctx.rank, tensors=self.live,
                                              staging=resolved.sync.mode == "async", **ctx.bridge_kwargs())

    def __getattr__(self, name: str):
        """poll(), apply(), version, torn, close(): the bridge's own (this rank wraps nothing else)."""
        if name == "bridge":
            raise AttributeError(name)
        return getattr(self.bridge, name)

    def tensors(self, rank: int) -> Mapping[str, torch.Tensor]:
        assert rank == self.rank
        return self.live
