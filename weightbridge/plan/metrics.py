"""``plan_metrics``: the documented ``weightbridge plan --json`` object.

Keys (all always present):

=========================  ==========================================================
``plan_hash``              sha256 hex of the plan (identical on every rank)
``num_rounds``             rounds, update and exchange
``num_buckets``            (round, sender, receiver) wire buffers
``num_items``              items over all buckets
``wire_bytes``             bytes arriving at rollout ranks (from trainers and forwarded by peers)
``update_bytes``           bytes trainers send
``exchange_bytes``         bytes rollout ranks forward (receiver de-replication)
``min_wire_bytes``         sum over receivers of the bytes each needs
``wire_bytes_by_dtype``    ``{dtype: bytes}`` of ``wire_bytes`` by wire dtype (FP8 values, fp32 scales, bf16, ...)
``quantized_weights``      weights the rollout receives quantised by the senders (``rollout.quantization``)
``unquantized_wire_bytes`` ``wire_bytes`` if those weights moved unquantised (engine-side quantisation), or null
``fp8_wire_ratio``         ``wire_bytes / unquantized_wire_bytes`` (the FP8 saving), or null
``max_sender_bytes``       over trainer ranks that send
``mean_sender_bytes``      over trainer ranks that send
``sender_balance``         max / mean sender bytes
``sender_balance_bound``   lowest max / mean any plan of these layouts can reach (unique data per sender)
``max_receiver_bytes``     bytes received, over rollout ranks (update + exchange)
``round_bytes``            the per-rank cap
``max_round_rank_bytes``   largest bytes one rank moves in one round
``max_stream_bytes``       most bytes of local tensors a streaming rollout rank holds at once (``docs/memory.md``)
``receiver_dedup``         whether receiver de-replication is used
``predicted_seconds``      cost model, this plan
``lower_bound_seconds``    max over links of this plan's bytes / bandwidth
``baseline_seconds``       gather-then-broadcast, same network
``stall_seconds``          average GPU stall, this plan, in ``sync_mode``
``baseline_stall_seconds`` average GPU stall, baseline, in ``sync_mode``
``sync_mode``              sync | async | colocated
``network``                network preset name
``placement``              where the cost model puts the ranks: ``{"sides": "disjoint" | "shared" | "colocated",
                           "ranks_per_node", "trainer_nodes", "rollout_nodes", "text"}``
                           (:meth:`~weightbridge.plan.network.NetworkModel.placement`)
``planning_seconds``       wall time of ``build_plan``, as measured by the caller (0.0 when not given)
``change_rate``            the expected share of elements changed per push (``plan --change-rate``), or null
``delta_wire_bytes``       with deltas (``sync.delta``) at ``change_rate``: expected wire bytes, or null
``predicted_delta_seconds`` with deltas at ``change_rate``: cost model, this plan, or null
``notes``                  planner decisions (list of strings)
``problems``               ``validate_plan`` output as strings (empty when valid)
=========================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from weightbridge.layout.ir import SideLayout, dtype_bytes
from weightbridge.plan.cost import baseline, price, price_delta, stall_seconds
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.streaming import plan_stream_peaks
from weightbridge.plan.types import ROLLOUT, TRAINER, PlanProblem, TransferPlan


def plan_metrics(
    plan: TransferPlan,
    trainer: SideLayout,
    rollout: SideLayout,
    *,
    network: NetworkModel,
    sync_mode: str = "sync",
    max_staleness: int = 1,
    problems: list[PlanProblem] | None = None,
    planning_seconds: float = 0.0,
    change_rate: float | None = None,
) -> dict[str, Any]:
    """The metrics object of ``plan``; ``planning_seconds`` is the caller's measurement of ``build_plan``.

    (The plan is a value: how long one process took to make it is not part of it.)
    """
    sender: dict[int, int] = {}
    receiver: dict[int, int] = {}
    round_rank = 0
    for r in plan.rounds:
        loads: dict[tuple[str, int], int] = {}
        for b in r.buckets:
            n = b.nbytes
            if b.src_side == TRAINER:
                sender[b.sender] = sender.get(b.sender, 0) + n
            receiver[b.receiver] = receiver.get(b.receiver, 0) + n
            k1, k2 = (b.src_side, b.sender), (ROLLOUT, b.receiver)
            loads[k1] = loads.get(k1, 0) + n
            loads[k2] = loads.get(k2, 0) + n
        round_rank = max(round_rank, max(loads.values(), default=0))
    senders = [v for v in sender.values() if v > 0]
    mean_s = sum(senders) / len(senders) if senders else 0.0
    max_s = max(senders, default=0)
    pred, bound = price(plan, network)
    delta_pred, delta_wire = price_delta(plan, network, change_rate) if change_rate is not None else (None, None)
    base = baseline(trainer, rollout, network)
    hbm = network.hbm_bytes_per_s
    stall = stall_seconds(
        mode=sync_mode, max_staleness=max_staleness, update_seconds=pred,
        trainer_ranks=trainer.world_size, rollout_ranks=rollout.world_size,
        trainer_async_seconds=max_s / hbm,  # snapshot into a staging buffer
        rollout_async_seconds=max(receiver.values(), default=0) / hbm,  # swap staging -> live
    )
    base_stall = stall_seconds(
        mode=sync_mode, max_staleness=max_staleness, update_seconds=base.seconds,
        trainer_ranks=trainer.world_size, rollout_ranks=rollout.world_size,
        trainer_async_seconds=base.seconds,  # the trainer drives gather and broadcast
        rollout_async_seconds=base.broadcast_seconds,  # engines pause in load_weights
    )
    by_dtype, unquantized = wire_by_dtype(plan, rollout)
    return {
        "plan_hash": plan.plan_hash,
        "num_rounds": plan.num_rounds,
        "num_buckets": sum(len(r.buckets) for r in plan.rounds),
        "num_items": plan.num_items(),
        "wire_bytes": plan.wire_bytes,
        "update_bytes": plan.update_bytes,
        "exchange_bytes": plan.exchange_bytes,
        "min_wire_bytes": plan.min_wire_bytes,
        "wire_bytes_by_dtype": by_dtype,
        "quantized_weights": len(rollout.quant),
        "unquantized_wire_bytes": unquantized if rollout.quant else None,
        "fp8_wire_ratio": plan.wire_bytes / unquantized if rollout.quant and unquantized else None,
        "max_sender_bytes": max_s,
        "mean_sender_bytes": mean_s,
        "sender_balance": (max_s / mean_s) if mean_s else 1.0,
        "sender_balance_bound": (plan.max_sender_bytes_bound / mean_s) if mean_s else 1.0,
        "max_receiver_bytes": max(receiver.values(), default=0),
        "round_bytes": plan.round_bytes,
        "max_round_rank_bytes": round_rank,
        "max_stream_bytes": max(plan_stream_peaks(plan, [{t.name: t.nbytes for t in r.tensors}
                                                         for r in rollout.ranks]), default=0),
        "receiver_dedup": plan.receiver_dedup,
        "predicted_seconds": pred,
        "lower_bound_seconds": bound,
        "baseline_seconds": base.seconds,
        "stall_seconds": stall,
        "baseline_stall_seconds": base_stall,
        "sync_mode": sync_mode,
        "network": network.name,
        "placement": network.placement(trainer.world_size, rollout.world_size),
        "planning_seconds": planning_seconds,
        "change_rate": change_rate,
        "delta_wire_bytes": None if delta_wire is None else int(delta_wire),
        "predicted_delta_seconds": delta_pred,
        "notes": list(plan.notes),
        "problems": [str(p) for p in (problems or [])],
    }


def wire_by_dtype(plan: TransferPlan, rollout: SideLayout) -> tuple[dict[str, int], int]:
    """``({wire dtype: bytes}, wire bytes were the quantised weights unquantised)``: an FP8 item of a
    weight ``rollout.quant`` lists would carry its elements in the dtype the engine quantises from,
    and its scale tensor's items nothing."""
    weights = {q.weight: dtype_bytes(q.source[-1]) if q.source else 2 for q in rollout.quant}
    scales = {q.scale for q in rollout.quant}
    by: dict[str, int] = {}
    unquantized = 0
    for r in plan.rounds:
        for b in r.buckets:
            for it in b.items:
                by[it.dtype] = by.get(it.dtype, 0) + it.nbytes
                size = weights.get(it.canonical)
                if size is not None:
                    unquantized += it.nbytes // dtype_bytes(it.dtype) * size
                elif it.canonical not in scales:
                    unquantized += it.nbytes
    return dict(sorted(by.items())), unquantized
