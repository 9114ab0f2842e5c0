"""Colocated: trainer and rollout tensors in one process, plan items copied directly (no wire, no store)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weightbridge.runtime.connect import device_of, load_spec
from weightbridge.runtime.options import reject_moved
from weightbridge.runtime.results import PushStats
from weightbridge.spec.resolve import ResolvedSpec
from weightbridge.sync.membership import check_tensors


class ColocatedBridge:
    """Trainer and rollout tensors in one process: plan items copied directly, no wire.

    ``trainer[t]`` are trainer rank ``t``'s tensors, ``rollout[r]`` rollout rank ``r``'s live
    tensors. ``push(version)`` copies every item (with dtype casts) and the local copies;
    if it raises midway the rollout side is ``torn`` until the next complete push.
    Cross-process colocated setups use :class:`TrainerBridge` / :class:`RolloutBridge`
    (``sync.mode: colocated`` behaves as ``sync`` there).
    """

    def __init__(
        self,
        resolved: ResolvedSpec,
        trainer: Mapping[int, Mapping[str, torch.Tensor]],
        rollout: Mapping[int, Mapping[str, torch.Tensor]],
    ) -> None:
        from weightbridge.plan import build_plan

        for side, given, layout in (("trainer", trainer, resolved.trainer), ("rollout", rollout, resolved.rollout)):
            if sorted(given) != list(range(layout.world_size)):
                raise ValueError(
                    f"{side} tensors for ranks {sorted(given)}; the spec has ranks 0..{layout.world_size - 1}"
                )
            for r in layout.ranks:
                check_tensors(r, given[r.rank])
        self.spec = resolved
        self.trainer = {t: dict(v) for t, v in trainer.items()}
        self.rollout = {r: dict(v) for r, v in rollout.items()}
        self.plan = build_plan(
            resolved.trainer, resolved.rollout,
            round_bytes=resolved.sync.round_bytes,
            receiver_dedup="off",  # one process: nothing to forward between instances
        )
        self.version: int | None = None
        self.torn = False

    @classmethod
    def from_spec(
        cls,
        spec: str | Path | ResolvedSpec,
        *,
        trainer: Mapping[int, Mapping[str, torch.Tensor]],
        rollout: Mapping[int, Mapping[str, torch.Tensor]],
        **moved: Any,
    ) -> ColocatedBridge:
        """Both sides' tensors by rank; ``round_bytes`` is the spec's ``sync.round_bytes``."""
        reject_moved("ColocatedBridge.from_spec", moved)
        return cls(load_spec(spec), trainer, rollout)

    def push(self, version: int) -> PushStats:
        from weightbridge.quant import quantized_sources
        from weightbridge.tensors import apply_local_copies, pack_items, unpack_items

        t0 = time.perf_counter()
        self.torn = True
        with torch.no_grad():
            for _, bucket in self.plan.buckets():
                buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device_of(self.rollout[bucket.receiver]))
                sources = quantized_sources(self.trainer[bucket.sender], self.spec.trainer.ranks[bucket.sender],
                                            self.spec.rollout.quant)  # FP8 targets: derived at the sender
                pack_items(bucket.items, sources, buf)
                unpack_items(bucket.items, buf, self.rollout[bucket.receiver])
            for r, tensors in self.rollout.items():
                apply_local_copies(self.plan.local_copies, tensors, rank=r)
        self.torn = False
        self.version = version
        dt = time.perf_counter() - t0
        return PushStats(
            version=version, seq=0, epoch=0, mode="colocated", bytes_sent=self.plan.wire_bytes,
            wire_bytes=self.plan.wire_bytes, seconds=dt, transfer_s=dt, wait_s=0.0,
            num_rounds=self.plan.num_rounds, new_epoch=False,
        )
