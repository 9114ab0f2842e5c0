"""The runtime's typed view of the control store: every key it reads or writes, as a method.

The runtime (:mod:`weightbridge.runtime`) never builds a store key or a message itself: it calls
these, which pair each key of :mod:`.messages`' layout with its message type. One :class:`Board`
per :class:`~weightbridge.sync.control.ControlPlane` (per rank and thread: :meth:`Board.clone`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

from weightbridge.sync.control import ControlPlane
from weightbridge.sync.messages import Ack, Announce, Hello, Join, Leave, Membership, Offer, decode
from weightbridge.sync.roster import ROLLOUT, RankId, Roster


class Board:
    """Typed reads and writes of one rank (``cp.me``) on the control store."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.keys = cp.keys
        self.me = cp.me

    def clone(self) -> Board:
        """A board on a new store connection, for another thread."""
        return Board(self.cp.clone())

    # -- joining and leaving (every rank) ----------------------------------------------------
    def join(self, instance: int, nonce: str) -> None:
        self.cp.set(self.keys.join(self.me.key), Join(side=self.me.side, rank=self.me.rank, instance=instance,
                                                      nonce=nonce, pid=os.getpid(), host=socket.gethostname()))

    def leave(self, nonce: str) -> None:
        self.cp.delete(self.keys.join(self.me.key))
        self.cp.set(self.keys.leave(self.me.key), Leave(side=self.me.side, rank=self.me.rank, nonce=nonce))

    def join_of(self, who: RankId) -> Join | None:
        return self.cp.get(self.keys.join(who.key), Join)

    def joined(self, ranks: Sequence[RankId]) -> bool:
        return self.cp.exists(self.join_keys(ranks))

    def join_keys(self, ranks: Sequence[RankId]) -> list[str]:
        return [self.keys.join(r.key) for r in ranks]

    def heartbeat(self, who: RankId) -> int:
        return self.cp.counter(self.keys.heartbeat(who.key))

    # -- epochs -----------------------------------------------------------------------------
    def open_epoch(self, roster: Roster, reason: str) -> Roster:
        """Trainer 0: number a new epoch for ``roster``'s members and publish its membership."""
        epoch = self.cp.increment(self.keys.epoch)
        self.cp.set(self.keys.members(epoch), Membership(
            epoch=epoch, num_trainers=roster.num_trainers, instances=roster.instances,
            rollout_ranks=roster.rollout_ranks, reason=reason,
        ))
        return Roster(roster.num_trainers, roster.instances, roster.rollout_ranks, epoch)

    def await_membership(self, epoch: int, deadline: float) -> Membership:
        raw = self.cp.wait_for([self.keys.members(epoch)], deadline, f"the membership of epoch {epoch}", epoch=epoch)
        return decode(raw[0], Membership)

    def handshake(
        self, roster: Roster, *, spec_hash: str, plan_hash: str, dtypes: str, dtype_diffs: tuple[str, ...],
        wire: str, nonce: str, expected_dtypes: Mapping[RankId, str], deadline: float,
    ) -> dict[RankId, Hello]:
        """Publish this rank's hello for ``roster``'s epoch and check every member's (contract 3)."""
        hello = Hello(side=self.me.side, rank=self.me.rank, epoch=roster.epoch, spec_hash=spec_hash,
                      plan_hash=plan_hash, dtypes=dtypes, dtype_diffs=dtype_diffs, wire=wire, nonce=nonce)
        return self.cp.handshake(hello, roster.members, expected_dtypes, deadline)

    def failure_count(self, epoch: int) -> int:
        return self.cp.counter(self.keys.failures(epoch))

    def group_prefix(self, epoch: int) -> str:
        return self.keys.group_prefix(epoch)

    # -- pushes -----------------------------------------------------------------------------
    def announce(self, seq: int, version: int, epoch: int) -> Announce:
        ann = Announce(seq=seq, version=version, epoch=epoch)
        self.cp.set(self.keys.announce, ann)
        return ann

    def announcement(self) -> Announce | None:
        """The latest announcement, or None before the first push."""
        return self.cp.get(self.keys.announce, Announce)

    def announcement_key(self) -> str:
        return self.keys.announce

    def ack(self, stage: str, ann: Announce) -> None:
        """Rollout ranks: this rank has push ``ann`` ``staged`` or ``applied``."""
        self.cp.set(self.keys.ack(stage, self.me.rank),
                    Ack(rank=self.me.rank, version=ann.version, seq=ann.seq, epoch=ann.epoch, stage=stage))

    def ack_of(self, stage: str, rollout_rank: int) -> Ack | None:
        return self.cp.get(self.keys.ack(stage, rollout_rank), Ack)

    def acks(self, stage: str, rollout_ranks: Sequence[int]) -> dict[int, Ack]:
        """The latest ``stage`` ack of each of ``rollout_ranks`` that has one."""
        out = {}
        for r in rollout_ranks:
            ack = self.ack_of(stage, r)
            if ack is not None:
                out[r] = ack
        return out

    def ack_keys(self, stage: str, rollout_ranks: Sequence[int]) -> list[str]:
        return [self.keys.ack(stage, r) for r in rollout_ranks]

    # -- instance apply agreement (rollout ranks of one instance) -----------------------------
    def offer(self, instance: int, session: str, offer: Offer) -> None:
        self.cp.set(self.keys.offer(instance, session, offer.round, self.me.rank), offer)

    def withdraw_offer(self, instance: int, session: str, round: int) -> None:
        self.cp.delete(self.keys.offer(instance, session, round, self.me.rank))

    def offer_keys(self, instance: int, session: str, round: int, rollout_ranks: Sequence[int]) -> list[str]:
        return [self.keys.offer(instance, session, round, r) for r in rollout_ranks]


def rollout_ids(ranks: Sequence[int]) -> list[RankId]:
    return [RankId(ROLLOUT, r) for r in ranks]
