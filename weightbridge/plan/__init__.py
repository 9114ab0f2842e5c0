"""The transfer planner: which trainer rank sends which boxes to which rollout rank, in which round.

Pure Python (no torch, no process group) and deterministic: every rank computes the same
plan from the same layouts and can compare :attr:`TransferPlan.plan_hash`.

Usage::

    plan = build_plan(trainer, rollout, round_bytes=2 << 30)
    problems = validate_plan(plan, trainer, rollout)   # every problem at once
    metrics = plan_metrics(plan, trainer, rollout, network=PRESETS["h100"])

See ``docs/planner.md`` for the algorithm, the wire order and the cost model; ``build_plan``'s
steps are one module each (``weightbridge/plan/build.py`` lists them).
"""

from weightbridge.plan.build import build_plan
from weightbridge.plan.errors import PlanError
from weightbridge.plan.metrics import plan_metrics
from weightbridge.plan.network import PRESETS, NetworkModel, NetworkSpec, network_model
from weightbridge.plan.types import (
    Bucket,
    LocalCopy,
    PlanProblem,
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
    "Round",
    "TransferItem",
    "TransferPlan",
    "WireItem",
    "build_plan",
    "network_model",
    "plan_metrics",
    "validate_plan",
]
