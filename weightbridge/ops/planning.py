"""One planning run of a resolved spec, as ``weightbridge plan`` and the MCP server do it.

:func:`plan_spec` picks the network model (the spec's, or an override), builds the plan,
validates it and prices it; :func:`top_imbalances` names the ranks that move the most
bytes relative to their side's mean. Pure: no torch, no process group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from weightbridge import plan as planner  # looked up per call: tests may replace planner.validate_plan
from weightbridge.plan.network import NetworkModel, local_copy_of, network_model
from weightbridge.plan.types import ROLLOUT, TRAINER, PlanProblem, TransferPlan
from weightbridge.spec.errors import SpecErrors, SpecProblem
from weightbridge.spec.resolve import ResolvedSpec

NETWORK_HINT = "see `weightbridge docs planner`, section 3"


@dataclass(frozen=True)
class PlanReport:
    """A plan with its problems (empty when valid) and the ``plan --json`` metrics object."""

    plan: TransferPlan
    problems: list[PlanProblem]
    metrics: dict[str, Any]
    network: NetworkModel


def plan_spec(
    resolved: ResolvedSpec,
    *,
    network: str | None = None,
    round_bytes: int | None = None,
    receiver_dedup: str | None = None,
    change_rate: float | None = None,
) -> PlanReport:
    """Plan one update of ``resolved``; ``network`` / ``round_bytes`` / ``receiver_dedup`` override the spec's;
    ``change_rate`` (the expected share of elements a push changes) adds the cost with ``sync.delta``.

    Raises :class:`SpecErrors` (path ``$.network...``) when the network is not a valid preset
    name or mapping.
    """
    sync = resolved.sync
    try:
        net = network_model(network if network else resolved.network, colocated=sync.mode == "colocated",
                            local_copy=local_copy_of(sync.transport))
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        errors = exc.errors() if isinstance(exc, ValidationError) else [{"loc": (), "msg": str(exc)}]
        raise SpecErrors(
            [
                SpecProblem("$.network" + "".join(f".{x}" for x in e.get("loc", ())), str(e.get("msg")), NETWORK_HINT,
                            file=str(resolved.path))
                for e in errors
            ]
        ) from None
    t0 = time.perf_counter()
    plan = planner.build_plan(resolved.trainer, resolved.rollout, round_bytes=int(round_bytes or sync.round_bytes),
                              network=net, receiver_dedup=receiver_dedup or sync.receiver_dedup)
    planning_seconds = time.perf_counter() - t0  # beside the plan: a measurement, not part of the value
    problems = planner.validate_plan(plan, resolved.trainer, resolved.rollout, canonical=resolved.canonical)
    metrics = planner.plan_metrics(plan, resolved.trainer, resolved.rollout, network=net, sync_mode=sync.mode,
                                   max_staleness=sync.max_staleness, problems=problems,
                                   planning_seconds=planning_seconds, change_rate=change_rate)
    return PlanReport(plan, problems, metrics, net)


def top_imbalances(plan: TransferPlan, limit: int = 5) -> list[dict[str, Any]]:
    """The ranks moving the most bytes relative to the mean of their role, busiest first.

    One entry per sender (trainer ranks; rollout ranks forwarding in the exchange) and per
    receiver above its role's mean: ``{"role", "side", "rank", "bytes", "mean_bytes",
    "vs_mean"}``. Empty when every rank of every role moves the same number of bytes.
    """
    roles = [("sender", TRAINER, plan.sender_bytes(TRAINER)), ("receiver", ROLLOUT, plan.receiver_bytes())]
    if plan.exchange_bytes:
        roles.insert(1, ("forwarder", ROLLOUT, plan.sender_bytes(ROLLOUT)))
    out: list[dict[str, Any]] = []
    for role, side, loads in roles:
        busy = {rank: n for rank, n in loads.items() if n > 0}
        if not busy:
            continue
        mean = sum(busy.values()) / len(busy)
        out += [
            {"role": role, "side": side, "rank": rank, "bytes": n, "mean_bytes": mean, "vs_mean": n / mean}
            for rank, n in busy.items()
            if n > mean * (1 + 1e-9)
        ]
    out.sort(key=lambda e: (-e["vs_mean"], -e["bytes"], e["role"], e["rank"]))
    return out[:limit]
