"""Who is who in one epoch: the only place that translates between rank numberings (pure).

Three numberings exist, and only :class:`Roster` converts between them:

* **spec ranks** (:class:`RankId`): ``trainer t`` / ``rollout r`` as the spec numbers them (rollout
  ranks instance-major). Every message on the store, every error and every log line uses these.
* **plan ranks**: the ranks of the epoch's :class:`~weightbridge.plan.types.TransferPlan`. Trainer
  plan rank = spec rank; rollout plan rank ``j`` is the ``j``-th rollout rank of the epoch's
  instances (instance-major, local-rank order), i.e. rollout ranks are renumbered ``0..R_e-1`` and
  instances ``0..I_e-1`` when some instances are absent.
* **bridge ranks**: ranks of the epoch's bridge group (trainers first): trainer ``t`` -> ``t``,
  rollout plan rank ``j`` -> ``num_trainers + j``.

A roster is an immutable value built from the epoch's membership (trainer 0 decides it; every
member reads the same ``Membership`` message and builds the same roster). The transport layer gets
one too (:func:`weightbridge.transport.group.create_bridge_group`), so its errors name spec ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # only for annotations: this module imports nothing heavy
    from weightbridge.layout.ir import SideLayout
    from weightbridge.sync.messages import Membership

TRAINER = "trainer"
ROLLOUT = "rollout"


class RankId(NamedTuple):
    """A rank in spec numbering, written ``trainer 1`` / ``rollout 3``."""

    side: str  # "trainer" | "rollout"
    rank: int  # rank within its side, as in the spec

    def __str__(self) -> str:
        return f"{self.side} {self.rank}"

    @property
    def key(self) -> str:
        """Store-key form: ``trainer/1``."""
        return f"{self.side}/{self.rank}"


def instance_rollout_ranks(rollout: SideLayout, instance: int) -> tuple[int, ...]:
    """Spec rollout ranks of ``instance``, in local-rank order."""
    return tuple(r.rank for r in sorted(rollout.instance_ranks(instance), key=lambda r: r.local_rank))


@dataclass(frozen=True)
class Roster:
    """The ranks of one epoch and every translation between spec, plan and bridge numbering."""

    num_trainers: int
    instances: tuple[int, ...]  # spec instance indices of the epoch, ascending
    rollout_ranks: tuple[int, ...]  # spec rollout rank of each rollout plan rank
    epoch: int = 0

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def of_instances(cls, rollout: SideLayout, num_trainers: int, instances: Sequence[int], epoch: int = 0) -> Roster:
        """The roster of ``instances`` (spec indices) of the spec's ``rollout`` side."""
        ranks: list[int] = []
        for inst in instances:
            ranks.extend(instance_rollout_ranks(rollout, inst))
        return cls(num_trainers, tuple(instances), tuple(ranks), epoch)

    @classmethod
    def of_membership(cls, m: Membership) -> Roster:
        return cls(m.num_trainers, tuple(m.instances), tuple(m.rollout_ranks), m.epoch)

    @classmethod
    def identity(cls, num_trainers: int, num_rollout: int) -> Roster:
        """Plan rank = spec rank on both sides (a bridge group used without a membership, e.g. in tests)."""
        return cls(num_trainers, (), tuple(range(num_rollout)), 0)

    # -- sizes and members ----------------------------------------------------------------
    @property
    def num_rollout(self) -> int:
        return len(self.rollout_ranks)

    @property
    def world_size(self) -> int:
        return self.num_trainers + self.num_rollout

    @property
    def members(self) -> tuple[RankId, ...]:
        """Every member in spec numbering, in bridge-rank order."""
        return tuple(self.spec_of_bridge(b) for b in range(self.world_size))

    def __contains__(self, who: object) -> bool:
        if not isinstance(who, tuple) or len(who) != 2:
            return False
        side, rank = who
        if side == TRAINER:
            return 0 <= rank < self.num_trainers
        return side == ROLLOUT and rank in self.rollout_ranks

    # -- translations ---------------------------------------------------------------------
    def plan_rank(self, who: RankId) -> int:
        """Plan rank of spec rank ``who`` (ValueError when it is not a member of the epoch)."""
        side, rank = who
        if side == TRAINER and 0 <= rank < self.num_trainers:
            return rank
        if side == ROLLOUT and rank in self.rollout_ranks:
            return self.rollout_ranks.index(rank)
        raise ValueError(
            f"{side} {rank} is not a member of epoch {self.epoch} (rollout ranks {list(self.rollout_ranks)})"
        )

    def spec_of_plan(self, side: str, plan_rank: int) -> RankId:
        """Spec rank of ``side``'s plan rank ``plan_rank``."""
        if side == TRAINER:
            if not 0 <= plan_rank < self.num_trainers:
                raise ValueError(f"trainer plan rank {plan_rank} outside [0, {self.num_trainers})")
            return RankId(TRAINER, plan_rank)
        if side == ROLLOUT:
            if not 0 <= plan_rank < self.num_rollout:
                raise ValueError(f"rollout plan rank {plan_rank} outside [0, {self.num_rollout})")
            return RankId(ROLLOUT, self.rollout_ranks[plan_rank])
        raise ValueError(f"side must be 'trainer' or 'rollout', got {side!r}")

    def bridge_of_plan(self, side: str, plan_rank: int) -> int:
        """Bridge rank of ``side``'s plan rank ``plan_rank``."""
        self.spec_of_plan(side, plan_rank)  # range check
        return plan_rank if side == TRAINER else self.num_trainers + plan_rank

    def bridge_rank(self, who: RankId) -> int:
        """Bridge rank of spec rank ``who``."""
        return self.bridge_of_plan(who.side, self.plan_rank(who))

    def plan_of_bridge(self, bridge_rank: int) -> tuple[str, int]:
        """(side, plan rank) of ``bridge_rank``."""
        if not 0 <= bridge_rank < self.world_size:
            raise ValueError(f"bridge rank {bridge_rank} outside [0, {self.world_size})")
        if bridge_rank < self.num_trainers:
            return TRAINER, bridge_rank
        return ROLLOUT, bridge_rank - self.num_trainers

    def spec_of_bridge(self, bridge_rank: int) -> RankId:
        return self.spec_of_plan(*self.plan_of_bridge(bridge_rank))

    def describe(self, bridge_rank: int) -> str:
        """``rollout 3 (bridge rank 2)``: how errors name a bridge rank."""
        try:
            return f"{self.spec_of_bridge(bridge_rank)} (bridge rank {bridge_rank})"
        except ValueError:
            return f"bridge rank {bridge_rank}"

    # -- the epoch's rollout layout ------------------------------------------------------
    def rollout_layout(self, rollout: SideLayout) -> SideLayout:
        """The spec's rollout layout restricted to this epoch's instances, renumbered to plan ranks.

        With every instance present (in order) the spec's own layout is returned unchanged, so
        the epoch plans exactly the update ``weightbridge plan`` shows.
        """
        if self.instances == tuple(range(rollout.num_instances)):
            return rollout
        from weightbridge.layout.ir import SideLayout

        by_rank = {r.rank: r for r in rollout.ranks}
        new_instance = {inst: i for i, inst in enumerate(self.instances)}
        ranks = tuple(
            dataclasses.replace(by_rank[spec], rank=j, instance=new_instance[by_rank[spec].instance])
            for j, spec in enumerate(self.rollout_ranks)
        )
        return SideLayout(rollout.side, ranks, num_instances=len(self.instances), casts=rollout.casts)
