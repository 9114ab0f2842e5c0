"""Membership helpers: the rollout layout of an epoch, its plan, and dtype digests (pure except torch dtypes).

An epoch's rollout side is a subset of the spec's instances (late joiners, restarts,
instances that left). Its plan is built over that subset with rollout ranks renumbered
``0..R_e-1`` instance-major (instances renumbered ``0..I_e-1``); when every instance is
present the spec's own layout is used unchanged, so the plan hash is the one
``weightbridge plan`` prints.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from weightbridge.layout.ir import RankLayout, SideLayout
from weightbridge.plan import build_plan
from weightbridge.plan.types import TransferPlan


def restrict_rollout(rollout: SideLayout, instances: Sequence[int]) -> SideLayout:
    """The rollout layout of ``instances`` only, ranks and instances renumbered in order."""
    if tuple(instances) == tuple(range(rollout.num_instances)):
        return rollout
    ranks: list[RankLayout] = []
    for new_index, inst in enumerate(instances):
        for r in sorted(rollout.instance_ranks(inst), key=lambda r: r.local_rank):
            ranks.append(dataclasses.replace(r, rank=len(ranks), instance=new_index))
    return SideLayout(rollout.side, tuple(ranks), num_instances=len(instances))


def rollout_ranks_of(rollout: SideLayout, instances: Sequence[int]) -> tuple[int, ...]:
    """Spec rollout ranks of ``instances``, in epoch (plan) order."""
    out: list[int] = []
    for inst in instances:
        out.extend(r.rank for r in sorted(rollout.instance_ranks(inst), key=lambda r: r.local_rank))
    return tuple(out)


class PlanCache:
    """One plan per rollout instance set, built on first use (every rank builds the same)."""

    def __init__(self, trainer: SideLayout, rollout: SideLayout, *, round_bytes: int, receiver_dedup: str) -> None:
        self.trainer = trainer
        self.rollout = rollout
        self.round_bytes = round_bytes
        self.receiver_dedup = receiver_dedup
        self._plans: dict[tuple[int, ...], TransferPlan] = {}

    def plan(self, instances: Sequence[int]) -> TransferPlan:
        key = tuple(instances)
        if key not in self._plans:
            self._plans[key] = build_plan(
                self.trainer,
                restrict_rollout(self.rollout, key),
                round_bytes=self.round_bytes,
                receiver_dedup=self.receiver_dedup,  # type: ignore[arg-type]
            )
        return self._plans[key]


def _digest(pairs: Sequence[tuple[str, str]]) -> str:
    text = "\n".join(f"{n}:{d}" for n, d in sorted(pairs))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def expected_dtypes(layout: RankLayout) -> str:
    """Digest of the dtypes the spec says ``layout``'s rank holds."""
    return _digest([(t.name, t.dtype) for t in layout.tensors])


def actual_dtypes(layout: RankLayout, tensors: Mapping[str, Any], max_diffs: int = 4) -> tuple[str, tuple[str, ...]]:
    """Digest of the real dtypes of ``layout``'s tensors in ``tensors``, and the first differences."""
    pairs, diffs = [], []
    for t in layout.tensors:
        got = str(tensors[t.name].dtype).removeprefix("torch.")
        pairs.append((t.name, got))
        if got != t.dtype:
            diffs.append(f"{t.name}: spec {t.dtype}, tensor {got}")
    more = len(diffs) - max_diffs
    shown = diffs[:max_diffs] + ([f"and {more} more"] if more > 0 else [])
    return _digest(pairs), tuple(shown)


def check_tensors(layout: RankLayout, tensors: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` listing missing tensors and shape mismatches (dtypes go through the handshake)."""
    problems = []
    for t in layout.tensors:
        if t.name not in tensors:
            problems.append(f"missing tensor {t.name} {list(t.shape)}")
        elif tuple(tensors[t.name].shape) != tuple(t.shape):
            problems.append(f"{t.name}: spec shape {list(t.shape)}, tensor {list(tensors[t.name].shape)}")
    if problems:
        head = f"{layout.side} rank {layout.rank}: {len(problems)} tensor problem(s): "
        raise ValueError(head + "; ".join(problems[:6]) + (" ..." if len(problems) > 6 else ""))
