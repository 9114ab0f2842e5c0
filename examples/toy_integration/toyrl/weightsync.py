"""The toyrl <-> weightbridge integration: all of it.

Trainer rank t (after each optimizer step)::

    sync = TrainerSync(trainer, spec, rank=t, **bridge_kwargs)   # once
    sync.push(step)                                              # every step, every rank

Engine rank r (in the serving loop, between engine steps)::

    sync = EngineSync(engine, spec, rank=r, **bridge_kwargs)     # once, whenever the engine starts
    if sync.poll():
        sync.apply()

Sync mode receives in place (no extra memory; the engine is paused for the update anyway); async
mode receives into a staging copy while the engine keeps serving, and apply() swaps it in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from weightbridge import RolloutBridge, TrainerBridge

from toyrl.engine import ToyEngine
from toyrl.trainer import ToyTrainer


class TrainerSync:
    """One trainer rank's sender: pushes the rank's live shards."""

    def __init__(self, trainer: ToyTrainer, spec: Any, *, rank: int, **bridge_kwargs: Any) -> None:
        self.trainer = trainer
        self.bridge = TrainerBridge.from_spec(spec, rank=rank, tensors=trainer.params, **bridge_kwargs)

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self.trainer.params

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.trainer.load_weights(weights)

    def push(self, version: int):
        return self.bridge.push(version)

    def close(self) -> None:
        self.bridge.close()


class EngineSync:
    """One engine rank's receiver: in place in sync mode, staged in async mode."""

    def __init__(self, engine: ToyEngine, spec: Any, *, rank: int, **bridge_kwargs: Any) -> None:
        self.engine, self.rank = engine, rank
        # staging follows the spec (sync.staging; by default: in place in sync mode, staged in async)
        self.bridge = RolloutBridge.from_spec(spec, rank=rank, tensors=engine.params, **bridge_kwargs)

    def poll(self) -> bool:
        return self.bridge.poll()

    def apply(self) -> int:
        return self.bridge.apply()

    @property
    def version(self) -> int | None:
        return self.bridge.version

    @property
    def torn(self) -> bool:
        return self.bridge.torn

    def tensors(self, rank: int) -> Mapping[str, torch.Tensor]:
        assert rank == self.rank, f"EngineSync holds rollout rank {self.rank}, not {rank}"
        return self.engine.params

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], rank: int) -> None:
        assert rank == self.rank
        self.engine.load_weights(weights)

    def close(self) -> None:
        self.bridge.close()
