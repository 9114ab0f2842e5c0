"""Replica groups: one update made of identical, independent sub-problems (planner step 0).

When every trainer rank has the same number ``k`` of ranks with identical layouts (itself
included: data-parallel replicas hold the same tensors made of the same pieces) and all ``I``
rollout instances share one template, the update splits into ``g = gcd(k, I)`` sub-problems
when ``g >= 2`` and receiver de-replication is not used (``build._plan_steps`` prices it on the
whole update first: it sends each unit to one instance of all, and groups would send it once
per group). Sub-problem ``j`` is members ``[j m, (j + 1) m)`` (``m = k / g``, members in
rank order) of every class of identical trainer ranks and instances ``[j B, (j + 1) B)``
(``B = I / g``) of the template. Every sub-problem holds the same layouts, so its plan is the
same up to renaming ranks: it is planned once, and a rank plans only its own sub-problem.

Without receiver de-replication nothing is lost by the split. Each sub-problem's senders hold everything its receivers need,
every trainer rank still sends ``1 / k`` of its class's traffic (the same bytes as splitting
every atom's rows over all ``k`` replicas), and the busiest rank moves the same bytes. What
changes is who talks to whom: a rollout rank hears from ``1 / g`` of the senders, so there are
``g`` times fewer buckets and messages, and planning cost no longer grows with ``k x I``.

Input: trainer and rollout :class:`SideLayout`. Output: :class:`Decomposition` or ``None``.
"""

from __future__ import annotations

from math import gcd
from typing import NamedTuple

from weightbridge.layout.ir import RankLayout, SideLayout
from weightbridge.plan.instances import Templates, group_instances
from weightbridge.plan.types import ROLLOUT, TRAINER, Bucket, LocalCopy, Round


class Decomposition(NamedTuple):
    """``groups`` sub-problems; ``trainer`` / ``rollout`` are sub-problem 0's layouts with ranks
    renumbered from 0; ``trainer_ranks[j][p]`` is the trainer rank of sub-rank ``p`` in
    sub-problem ``j`` (likewise ``rollout_ranks``)."""

    groups: int
    trainer: SideLayout
    rollout: SideLayout
    trainer_ranks: tuple[tuple[int, ...], ...]
    rollout_ranks: tuple[tuple[int, ...], ...]
    templates: Templates  # of the whole rollout (one template)

    def holders(self, sub: tuple[int, ...]) -> tuple[int, ...]:
        """Sub-problem trainer ranks -> the trainer ranks holding the same data in every sub-problem."""
        return tuple(ranks[s] for ranks in self.trainer_ranks for s in sub)

    def locate(self, side: str, rank: int) -> tuple[int, int]:
        """``(sub-problem, sub-rank)`` of ``rank`` of ``side``; ``ValueError`` if it is in none."""
        for j, ranks in enumerate(self.trainer_ranks if side == TRAINER else self.rollout_ranks):
            if rank in ranks:
                return j, ranks.index(rank)
        raise ValueError(f"{side} rank {rank} is not in the layouts")

    @property
    def note(self) -> str:
        return (f"replica groups: {self.groups} independent sub-problems of {self.trainer.world_size} trainer x "
                f"{self.rollout.world_size} rollout ranks (identical data-parallel trainer replicas each serve "
                f"1/{self.groups} of the rollout instances)")


def decompose(trainer: SideLayout, rollout: SideLayout) -> Decomposition | None:
    """The update's replica groups, or ``None`` when it does not split (``g < 2``)."""
    by_id: dict[int, list[RankLayout]] = {}
    for lay in trainer.ranks:  # resolvers share one tensor tuple among replicas: grouping by id is free
        by_id.setdefault(id(lay.tensors), []).append(lay)
    classes: dict[tuple, list[RankLayout]] = {}
    for lays in by_id.values():
        classes.setdefault(lays[0].tensors, []).extend(lays)
    sizes = {len(c) for c in classes.values()}
    if len(sizes) != 1:
        return None
    k = sizes.pop()
    templates = group_instances(rollout)
    if k < 2 or len(templates) != 1:
        return None
    tpl = templates[0]
    g = gcd(k, len(tpl.instances))
    if g < 2:
        return None
    m, per = k // g, len(tpl.instances) // g
    members = sorted((sorted(c, key=lambda x: x.rank) for c in classes.values()), key=lambda c: c[0].rank)
    # sub-rank order: sub-problem 0's ranks in rank order; sub-problem j takes the same class member
    slots = sorted(((c[q].rank, ci, q) for ci, c in enumerate(members) for q in range(m)))
    trainer_ranks = tuple(tuple(members[ci][j * m + q].rank for _, ci, q in slots) for j in range(g))
    sub_trainer = SideLayout(TRAINER, tuple(
        RankLayout(TRAINER, p, members[ci][q].tensors, coords=members[ci][q].coords)
        for p, (_, ci, q) in enumerate(slots)))
    width = len(tpl.layouts)
    sub_rollout = SideLayout(ROLLOUT, tuple(
        RankLayout(ROLLOUT, b * width + l, lay.tensors, instance=b, local_rank=lay.local_rank, coords=lay.coords)
        for b in range(per) for l, lay in enumerate(tpl.layouts)), num_instances=per, casts=rollout.casts)
    rollout_ranks = tuple(tuple(tpl.ranks[j * per + b][l] for b in range(per) for l in range(width))
                          for j in range(g))
    return Decomposition(g, sub_trainer, sub_rollout, trainer_ranks, rollout_ranks, templates)


def rename_rounds(rounds: tuple[Round, ...], d: Decomposition, groups: range) -> tuple[Round, ...]:
    """Sub-problem rounds -> the rounds of sub-problems ``groups`` together, in real ranks."""
    new = tuple.__new__
    out = []
    for rnd in rounds:
        buckets = []
        for j in groups:
            tr, ro = d.trainer_ranks[j], d.rollout_ranks[j]
            buckets.extend(new(Bucket, (b.src_side, (tr if b.src_side == TRAINER else ro)[b.sender], ro[b.receiver],
                                        b.items, b.nbytes)) for b in rnd.buckets)
        buckets.sort()
        out.append(Round(rnd.index, tuple(buckets)))
    return tuple(out)


def rename_copies(copies: tuple[LocalCopy, ...], d: Decomposition, groups: range) -> tuple[LocalCopy, ...]:
    """Sub-problem local copies -> those of sub-problems ``groups``, in real ranks, sorted."""
    return tuple(sorted(c._replace(rank=d.rollout_ranks[j][c.rank]) for j in groups for c in copies))


__all__ = ["Decomposition", "decompose", "rename_copies", "rename_rounds"]
