"""Conformance-suite sides for the Megatron-Core trainer (called inside the suite's rank processes).

Trainer: :class:`weightbridge.testing._internal.megatron.MegatronTrainerRank` as shipped (its own Gloo world,
``parallel_state`` at the spec's ``trainer.mesh``, the GPTModel's live parameters by Megatron
name; its ``load_weights`` writes full HF tensors into the shards through the introspected IR,
so the suite's trainer probe checks introspection against the spec). Rollout: a vLLM-style
layout-only stand-in (live tensors in the spec's rollout layout; no loader of its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import yaml

from weightbridge.bridge import RolloutBridge
from weightbridge.tensors import empty_like_layout
from weightbridge.testing._internal.megatron import MegatronTrainerRank

MegatronTrainer = MegatronTrainerRank


def write_spec(directory: Path) -> Path:
    """Tiny Qwen2 (2 query groups, tied, q/k/v bias): Megatron TP2 (local spec) -> 2 vLLM-style TP1 instances."""
    from weightbridge.testing._internal.vllm_selfcheck import hf_config

    hf_config("qwen2", num_key_value_heads=2).save_pretrained(directory)
    spec = {"version": 1, "model": {"config": str((directory / "config.json").resolve())},
            "trainer": {"preset": "megatron", "mesh": {"tp": 2},
                        "params": {"local_spec": True, "moe_grouped_gemm": False}},
            "rollout": {"preset": "vllm", "mesh": {"tp": 1}, "instances": 2}}
    path = directory / "weightbridge.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class StandInRolloutRank:
    """One vLLM-style TP rank holding the spec's rollout layout; the bridge does everything."""

    def __init__(self, ctx) -> None:
        resolved = ctx.resolved()
        self.rank = ctx.rank
        self.live = empty_like_layout(resolved.rollout.ranks[ctx.rank])
        self.bridge = RolloutBridge.from_spec(resolved, rank=ctx.rank, tensors=self.live, **ctx.bridge_kwargs())

    def __getattr__(self, name: str):
        if name == "bridge":
            raise AttributeError(name)
        return getattr(self.bridge, name)

    def tensors(self, rank: int) -> Mapping[str, torch.Tensor]:
        assert rank == self.rank
        return self.live
