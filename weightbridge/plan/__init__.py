"""The transfer planner: which trainer rank sends which boxes to which rollout rank, in which round.

Pure Python (no torch, no process group) and deterministic: ``build_plan`` gives the whole plan
(for people and validation); each bridge rank builds only its slice of that plan with
``build_rank_plan`` and compares :attr:`RankPlan.plan_hash` (the hash of the plan's inputs).

Usage::

    plan = build_plan(trainer, rollout, round_bytes=2 << 30)
    problems = validate_plan(plan, trainer, rollout)   # every problem at once
    metrics = plan_metrics(plan, trainer, rollout, network=PRESETS["h100"])

See ``docs/planner.md`` for the algorithm, the wire order and the cost model; ``build_plan``'s
steps are one module each (``weightbridge/plan/build.py`` lists them).
"""

from weightbridge.plan.build import build_plan, build_rank_plan
from weightbridge.plan.errors import PlanError
from weightbridge.plan.metrics import plan_metrics
from weightbridge.plan.network import PRESETS, NetworkModel, NetworkSpec, network_model
from weightbridge.plan.types import (
    Bucket,
    LocalCopy,
    PlanProblem,
    RankPlan,
    Round,
    TransferItem,
    TransferPlan,
    WireItem,
)
from weightbridge.plan.validate import validate_plan

__all__ = [
    "PRESETS",
    "Bucket",
    "LocalCopy",
    "NetworkModel",
    "NetworkSpec",
    "PlanError",
    "PlanProblem",
    "RankPlan",
    "Round",
    "TransferItem",
    "TransferPlan",
    "WireItem",
    "build_plan",
    "build_rank_plan",
    "network_model",
    "plan_metrics",
    "validate_plan",
]
