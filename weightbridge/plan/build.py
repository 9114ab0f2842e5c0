"""``build_plan``: trainer layout x rollout layout -> :class:`TransferPlan`.

A pipeline of pure steps, one module each, every step's input named (see ``docs/planner.md``)::

    replicas.decompose(trainer, rollout)                  -> Decomposition | None   plan one replica group
    sources.index_sources(trainer)                        -> AtomIndex   atoms and their holders
    instances.group_instances(rollout)                    -> Templates   identical instances once
    cover.cover_needs(templates, atoms)                   -> Cover       needs cut by atom, local copies
    decide.decide_receiver_dedup(cover, templates, net)   -> DedupDecision        (``auto`` only)
    relays.relay_groups(templates, net)                   -> Relays      instances by node (de-replication only)
    dereplicate.make_packets(cover, templates, dedup, round_bytes, relays) -> Packets  units, sender split, forwards
    rounds.pack(packets, templates, round_bytes)          -> Schedule    the round of every packet
    assemble.assemble(packets, schedule, templates)       -> tuple[Round, ...]   (only=(side, rank): a slice)
    TransferPlan(rounds, cover.copies, ...)                              hashed from its content

Everything iterates in sorted, deterministic order; no set or dict order leaks into the plan.
"""

from __future__ import annotations

from itertools import chain
from typing import Literal, NamedTuple

from weightbridge.gc_pause import gc_paused
from weightbridge.layout.ir import SideLayout
from weightbridge.layout.quant import sender_sources
from weightbridge.plan.assemble import assemble
from weightbridge.plan.cover import Cover, cover_needs
from weightbridge.plan.decide import decide_receiver_dedup
from weightbridge.plan.dereplicate import Packets, make_packets
from weightbridge.plan.errors import PlanError
from weightbridge.plan.hashing import plan_inputs_hash
from weightbridge.plan.instances import Templates, group_instances, locate_rank
from weightbridge.plan.network import PRESETS, NetworkModel
from weightbridge.plan.relays import relay_groups
from weightbridge.plan.replicas import Decomposition, decompose, rename_copies, rename_rounds
from weightbridge.plan.rounds import Schedule, pack
from weightbridge.plan.sources import index_sources
from weightbridge.plan.types import ROLLOUT, TRAINER, RankPlan, Round, TransferPlan


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

    Weights ``rollout.quant`` receives quantised move as FP8 values and scales from the trainer
    ranks holding their whole blocks (:func:`weightbridge.layout.quant.sender_sources`: the
    planner's trainer layout has their virtual source tensors instead of their own pieces).

    Pure and deterministic. Raises :class:`PlanError` (a ``ValueError``) for bad arguments only,
    never for an incomplete layout pair (elements nobody holds are simply not sent): run
    :func:`weightbridge.plan.validate_plan` to get every problem.
    """
    net = _check(round_bytes, receiver_dedup, network)
    with gc_paused():
        return _build(trainer, rollout, round_bytes, net, receiver_dedup)


class _Steps(NamedTuple):
    """What the steps before assembly produce (every rank computes all of it: it is per template)."""

    templates: Templates
    cover: Cover
    packets: Packets
    schedule: Schedule
    receiver_dedup: bool
    notes: tuple[str, ...]

    @property
    def num_rounds(self) -> int:
        return 1 + max(chain(self.schedule.update_rounds, self.schedule.forward_rounds), default=-1)

    @property
    def wire_bytes(self) -> int:
        sizes = [len(t.ranks) for t in self.templates]
        return (sum(b * (sizes[g] if i < 0 else 1) for _, _, g, _, i, b, _ in self.packets.updates)
                + sum(b * len(targets) for _, _, g, _, _, b, _, _, targets in self.packets.forwards))


def _steps(trainer: SideLayout, rollout: SideLayout, round_bytes: int, net: NetworkModel,
           receiver_dedup: str, only: tuple[str, int] | None = None, whole: Decomposition | None = None,
           ) -> _Steps | str:
    """Steps 1-5; with ``only=(side, rank)`` only that rank's packets get their items.

    ``whole``: these layouts are that decomposition's sub-problem. Under ``"auto"`` receiver
    de-replication is then priced on the whole update (every instance, real ranks); if it pays, the
    decision's note (replica groups would send every unit once per group: the caller plans the
    update whole).
    """
    atoms = index_sources(trainer)
    templates = group_instances(rollout)
    sender = slot = None
    if only is not None and only[0] == TRAINER:
        sender = only[1]
    elif only is not None:
        slot = locate_rank(templates, only[1])[:2]
    cover = cover_needs(templates, atoms)
    notes: list[str] = []
    dedup = [False] * len(templates)
    if whole is not None:
        if receiver_dedup == "auto":
            decision = decide_receiver_dedup(cover, whole.templates, net, holders=whole.holders)
            if decision.use:
                return decision.note
            notes.append(decision.note)
        notes.append(whole.note)
    elif receiver_dedup == "on":
        dedup = [len(t.ranks) > 1 for t in templates]
    elif receiver_dedup == "auto" and any(len(t.ranks) > 1 for t in templates):
        decision = decide_receiver_dedup(cover, templates, net)
        notes.append(decision.note)
        if decision.use:
            dedup = [len(t.ranks) > 1 for t in templates]
    relays = relay_groups(templates, net) if any(dedup) else None
    # NIC balance over the real ranks' NICs (a replica group's sub-problem has renumbered ranks: per rank)
    nic_of = None if whole is not None or net.nics_per_node is None else (lambda s: net.nic_of(TRAINER, s))
    # The colocated data plane: each receiver's boxes from a holder on its GPU / host first (real ranks only)
    near = None if whole is not None or net.local_copy == "off" else (lambda s, r: net.nearness(TRAINER, s, r))
    packets = make_packets(cover, templates, dedup, round_bytes, sender=sender, slot=slot, relays=relays,
                           nic_of=nic_of, near=near, casts=dict(rollout.casts))
    return _Steps(templates, cover, packets, pack(packets, templates, round_bytes), any(dedup), tuple(notes))


def _plan_steps(trainer: SideLayout, rollout: SideLayout, round_bytes: int, net: NetworkModel, receiver_dedup: str,
                only: tuple[str, int] | None = None) -> tuple[_Steps, Decomposition | None, int, int]:
    """Steps 0-5: ``(steps, decomposition or None, sub-problem of `only`, its rank there)`` (with no
    decomposition: sub-problem 0 and ``only``'s own rank). Replica groups are used unless receiver de-replication is (it
    sends each unit to one instance of all and forwards it from there: splitting the instances
    into groups would send it once per group)."""
    d = decompose(trainer, rollout) if receiver_dedup != "on" else None
    if d is not None:
        j, sub = d.locate(*only) if only is not None else (0, 0)
        st = _steps(d.trainer, d.rollout, round_bytes, net, receiver_dedup, None if only is None else (only[0], sub),
                    whole=d)
        if not isinstance(st, str):
            return st, d, j, sub
        whole = _steps(trainer, rollout, round_bytes, net, "on", only)  # priced above on the whole update: it pays
        assert not isinstance(whole, str)
        return whole._replace(notes=(st, *whole.notes)), None, 0, only[1] if only else 0
    st = _steps(trainer, rollout, round_bytes, net, receiver_dedup, only)
    assert not isinstance(st, str)
    return st, None, 0, only[1] if only else 0


def _build(trainer: SideLayout, rollout: SideLayout, round_bytes: int, net: NetworkModel,
           receiver_dedup: str) -> TransferPlan:
    st, d, _, _ = _plan_steps(sender_sources(trainer, rollout.quant), rollout, round_bytes, net, receiver_dedup)
    rounds = assemble(st.packets, st.schedule, st.templates)
    copies = st.cover.copies
    if d is not None:
        rounds, copies = rename_rounds(rounds, d, range(d.groups)), rename_copies(copies, d, range(d.groups))
    return TransferPlan(rounds=rounds, local_copies=copies, **_described(st, d, trainer, rollout, round_bytes))


def _described(st: _Steps, d: Decomposition | None, trainer: SideLayout, rollout: SideLayout,
               round_bytes: int) -> dict:
    """The fields a :class:`TransferPlan` and a :class:`RankPlan` share: they describe the whole plan."""
    return {"round_bytes": round_bytes, "num_senders": trainer.world_size, "num_receivers": rollout.world_size,
            "receiver_dedup": st.receiver_dedup, "min_wire_bytes": st.cover.min_wire_bytes * (d.groups if d else 1),
            "max_sender_bytes_bound": st.packets.sender_bound, "notes": st.notes}


def build_rank_plan(
    trainer: SideLayout,
    rollout: SideLayout,
    *,
    side: str,
    rank: int,
    round_bytes: int,
    network: NetworkModel | None = None,
    receiver_dedup: Literal["auto", "on", "off"] = "auto",
    inputs_hash: str | None = None,
) -> RankPlan:
    """The slice of :func:`build_plan`'s plan that rank ``rank`` of ``side`` takes part in.

    Every rank of both sides calls this with the same layouts and arguments (in place of
    ``build_plan``): it returns exactly the buckets of the global plan that this rank sends or
    receives, in the same rounds, and its local copies, without building anyone else's buckets.
    Ranks agree when their ``plan_hash`` (a hash of the planner version and these inputs; pass
    ``inputs_hash`` when the caller already has one, e.g. from the spec) is equal.
    """
    net = _check(round_bytes, receiver_dedup, network)
    with gc_paused():
        st, d, j, sub = _plan_steps(sender_sources(trainer, rollout.quant), rollout, round_bytes, net,
                                    receiver_dedup, (side, rank))
        rounds = assemble(st.packets, st.schedule, st.templates, only=(side, sub))
        copies = tuple(c for c in st.cover.copies if side == ROLLOUT and c.rank == sub)
        if d is not None:
            rounds, copies = rename_rounds(rounds, d, range(j, j + 1)), rename_copies(copies, d, range(j, j + 1))
        given = {r.index: r for r in rounds}
        return RankPlan(
            side=side,
            rank=rank,
            rounds=tuple(given.get(i) or Round(i, ()) for i in range(st.num_rounds)),
            local_copies=copies,
            wire_bytes=st.wire_bytes * (d.groups if d else 1),
            plan_hash=inputs_hash or plan_inputs_hash(trainer, rollout, round_bytes, net, receiver_dedup),
            **_described(st, d, trainer, rollout, round_bytes),
        )


def _check(round_bytes: int, receiver_dedup: str, network: NetworkModel | None) -> NetworkModel:
    if round_bytes <= 0:
        raise PlanError(f"round_bytes must be positive, got {round_bytes}")
    if receiver_dedup not in ("auto", "on", "off"):
        raise PlanError(f"receiver_dedup must be auto, on or off, got {receiver_dedup!r}")
    return network or PRESETS["h100"]


__all__ = ["build_plan", "build_rank_plan"]
