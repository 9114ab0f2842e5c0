"""ToyTrainer: one data-parallel rank; vectors replicated, every matrix split by rows (torch.chunk)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from toyrl.model import ToyConfig


class ToyTrainer:
    """Rank ``rank`` of ``world``; ``params`` are its fp32 shards under the checkpoint names."""

    def __init__(self, cfg: ToyConfig, *, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.params = {n: self._shard(torch.zeros(s)).clone() for n, s in cfg.shapes().items()}

    def _shard(self, full: torch.Tensor) -> torch.Tensor:
        return full if full.dim() == 1 else full.chunk(self.world, 0)[self.rank]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full checkpoint tensors into this rank's shards."""
        for name, full in weights:
            self.params[name].copy_(self._shard(full))

    @torch.no_grad()
    def train_step(self, lr: float = 1e-3) -> None:
        """Stand-in for an optimizer step (changes every weight)."""
        for p in self.params.values():
            p.sub_(lr * torch.sign(p))
