"""The demo's reference integration (weightbridge/demo) as conformance-suite sides.

Trainer rank: the demo's FSDP2 model (``build_fsdp2_model``) in its own Gloo world, pushing the
DTensor local shards as ``weightbridge.demo.workers.trainer_main`` does. Rollout rank: the demo's
vLLM-style rank as ``rollout_main`` builds it (live tensors in the spec's layout; in place in sync
mode, staged in async mode). Called inside the suite's rank processes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weightbridge.bridge import RolloutBridge
from weightbridge.demo.fsdp2 import FSDP2TrainerRank
from weightbridge.tensors import empty_like_layout


class DemoTrainerRank(FSDP2TrainerRank):
    """One FSDP2 trainer rank of the demo (float32 master weights, sharded on dp)."""

    def build_model(self, ctx, mesh):
        from weightbridge.demo.model import build_fsdp2_model

        return build_fsdp2_model(mesh)


class DemoRolloutRank:
    """One vLLM-style TP rank of the demo; it has no loader of its own (see the known gap)."""

    def __init__(self, ctx) -> None:
        resolved = ctx.resolved()
        self.rank = ctx.rank
        self.live = empty_like_layout(resolved.rollout.ranks[ctx.rank])
        self.bridge = RolloutBridge.from_spec(resolved, rank=ctx.rank, tensors=self.live, **ctx.bridge_kwargs())

    def __getattr__(self, name: str):
        """poll(), apply(), version, torn, close(): the bridge's own (this rank wraps nothing else)."""
        if name == "bridge":
            raise AttributeError(name)
        return getattr(self.bridge, name)

    def tensors(self, rank: int) -> Mapping[str, torch.Tensor]:
        assert rank == self.rank
        return self.live
