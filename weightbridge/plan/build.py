"""``build_plan``: trainer layout x rollout layout -> :class:`TransferPlan`.

A pipeline of pure steps, one module each, every step's input named (see ``docs/planner.md``)::

    sources.index_sources(trainer)                        -> AtomIndex   atoms and their holders
    instances.group_instances(rollout)                    -> Templates   identical instances once
    cover.cover_needs(templates, atoms)                   -> Cover       needs cut by atom, local copies
    decide.decide_receiver_dedup(cover, templates, net)   -> DedupDecision        (``auto`` only)
    dereplicate.make_packets(cover, templates, dedup, round_bytes) -> Packets  units, sender split, forwards
    rounds.pack(packets, templates, round_bytes)          -> Schedule    the round of every packet
    assemble.assemble(packets, schedule, templates)       -> tuple[Round, ...]
    TransferPlan(rounds, cover.copies, ...)                              hashed from its content

Everything iterates in sorted, deterministic order; no set or dict order leaks into the plan.
"""

from __future__ import annotations

import gc
from typing import Literal

from weightbridge.layout.ir import SideLayout
from weightbridge.plan.assemble import assemble
from weightbridge.plan.cover import cover_needs
from weightbridge.plan.decide import decide_receiver_dedup
from weightbridge.plan.dereplicate import make_packets
from weightbridge.plan.errors import PlanError
from weightbridge.plan.instances import group_instances
from weightbridge.plan.network import PRESETS, NetworkModel
from weightbridge.plan.rounds import pack
from weightbridge.plan.sources import index_sources
from weightbridge.plan.types import TransferPlan


def build_plan(
    trainer: SideLayout,
    rollout: SideLayout,
    *,
    round_bytes: int,
    network: NetworkModel | None = None,
    receiver_dedup: Literal["auto", "on", "off"] = "auto",
) -> TransferPlan:
    """Plan one weight update from ``trainer`` ranks to ``rollout`` ranks.

    ``round_bytes`` caps the wire bytes (sent + received) of every rank in every round.
    ``network`` (default: the ``h100`` preset) prices receiver de-replication when
    ``receiver_dedup="auto"``; ``"on"``/``"off"`` force it. Call order: every trainer and
    rollout rank calls this with the same layouts and arguments, then compares
    :attr:`TransferPlan.plan_hash` with its peers before executing (a mismatch means the
    ranks disagree on layouts or planner version).

    Pure and deterministic. Raises :class:`PlanError` (a ``ValueError``) for bad arguments only,
    never for an incomplete layout pair (elements nobody holds are simply not sent): run
    :func:`weightbridge.plan.validate_plan` to get every problem.
    """
    if round_bytes <= 0:
        raise PlanError(f"round_bytes must be positive, got {round_bytes}")
    if receiver_dedup not in ("auto", "on", "off"):
        raise PlanError(f"receiver_dedup must be auto, on or off, got {receiver_dedup!r}")
    net = network or PRESETS["h100"]
    # The build allocates ~1e6 small acyclic tuples next to a large live layout; generational
    # GC passes over that heap cost more than the build itself, so pause GC while building.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(trainer, rollout, round_bytes, net, receiver_dedup)
    finally:
        if was_enabled:
            gc.enable()


def _build(trainer: SideLayout, rollout: SideLayout, round_bytes: int, net: NetworkModel,
           receiver_dedup: str) -> TransferPlan:
    atoms = index_sources(trainer)
    templates = group_instances(rollout)
    cover = cover_needs(templates, atoms)
    notes: list[str] = []
    dedup = [False] * len(templates)
    if receiver_dedup == "on":
        dedup = [len(t.ranks) > 1 for t in templates]
    elif receiver_dedup == "auto" and any(len(t.ranks) > 1 for t in templates):
        decision = decide_receiver_dedup(cover, templates, net)
        notes.append(decision.note)
        if decision.use:
            dedup = [len(t.ranks) > 1 for t in templates]
    packets = make_packets(cover, templates, dedup, round_bytes)
    schedule = pack(packets, templates, round_bytes)
    rounds = assemble(packets, schedule, templates)
    return TransferPlan(
        rounds=rounds,
        local_copies=cover.copies,
        round_bytes=round_bytes,
        num_senders=trainer.world_size,
        num_receivers=rollout.world_size,
        receiver_dedup=any(dedup),
        min_wire_bytes=cover.min_wire_bytes,
        max_sender_bytes_bound=packets.sender_bound,
        notes=tuple(notes),
    )


__all__ = ["build_plan"]
