"""The runtime's typed view of the control store: every key it reads or writes, as a method.

The runtime (:mod:`weightbridge.runtime`) never builds a store key or a message itself: it calls
these, which pair each key of :mod:`.messages`' layout with its message type. One :class:`Board`
per :class:`~weightbridge.sync.control.ControlPlane` (per rank and thread: :meth:`Board.clone`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence

from weightbridge.errors import ForgedMessage, ProtocolError
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.handshake import handshake
from weightbridge.sync.messages import Ack, Announce, DeviceIdentity, Hello, Join, Leave, Membership, Offer
from weightbridge.sync.roster import ROLLOUT, RankId, Roster

log = logging.getLogger(__name__)

KEEP_EPOCHS = 3  # trainer 0 keeps the keys of the newest epochs it opened (a late rank may still read them)


class Board:
    """Typed reads and writes of one rank (``cp.me``) on the control store."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._keys = cp.keys
        self.me = cp.me
        self.nonce = ""  # this rank's join nonce (set by join(); acks carry it)
        self._epoch = 0  # trainer 0: the newest epoch it opened (epoch numbers never go backwards)
        self._opened: dict[int, Roster] = {}  # trainer 0: epochs it opened whose keys are still on the store

    def clone(self) -> Board:
        """A board on a new store connection, for another thread."""
        board = Board(self.cp.clone())
        board.nonce = self.nonce
        return board

    # -- joining and leaving (every rank) ----------------------------------------------------
    def join(self, instance: int, nonce: str, started: int = 0) -> None:
        self.nonce = nonce
        self.cp.set(self._keys.join(self.me.key), Join(side=self.me.side, rank=self.me.rank, instance=instance,
                                                      nonce=nonce, pid=os.getpid(), host=socket.gethostname(),
                                                      started=started))

    def leave(self, nonce: str) -> None:
        self.cp.delete(self._keys.join(self.me.key))
        self.cp.set(self._keys.leave(self.me.key), Leave(side=self.me.side, rank=self.me.rank, nonce=nonce))

    def join_of(self, who: RankId) -> Join | None:
        key = self._keys.join(who.key)
        join = self.cp.get(key, Join)
        if join is not None and (join.side, join.rank) != (who.side, who.rank):
            raise ProtocolError(self.me, f"the join under {key!r} is {join.side} {join.rank}'s")
        return join

    def joined(self, ranks: Sequence[RankId]) -> bool:
        return self.cp.exists(self.join_keys(ranks))

    def join_keys(self, ranks: Sequence[RankId]) -> list[str]:
        return [self._keys.join(r.key) for r in ranks]

    def heartbeat(self, who: RankId) -> int | None:
        """``who``'s heartbeat counter (0: none yet; None: unreadable, no reading)."""
        return self.cp.heartbeat(who)

    # -- epochs -----------------------------------------------------------------------------
    def open_epoch(self, roster: Roster, reason: str) -> Roster:
        """Trainer 0: number a new epoch for ``roster``'s members and publish its membership.

        The number is max(the store's, the last this board opened) + 1, skipping numbers whose
        membership key exists: a replayed old epoch value (or a restarted trainer 0) never reuses
        an epoch's keys. A value that is not authenticated is ignored (and overwritten).
        """
        try:
            stored = self.cp.counter(self._keys.epoch)
        except (ForgedMessage, ProtocolError) as exc:
            log.warning("%s: ignoring the epoch value on the store: %s", self.me, exc)
            stored = 0
        epoch = max(stored, self._epoch) + 1
        for _ in range(10_000):
            if not self.cp.exists([self._keys.members(epoch)]):
                break
            epoch += 1
        else:
            raise ProtocolError(self.me, f"epochs up to {epoch} all have a membership key on the store")
        self._epoch = epoch
        self.cp.set_counter(self._keys.epoch, epoch)
        self.cp.set(self._keys.members(epoch), Membership(
            epoch=epoch, num_trainers=roster.num_trainers, instances=roster.instances,
            rollout_ranks=roster.rollout_ranks, reason=reason,
        ))
        opened = Roster(roster.num_trainers, roster.instances, roster.rollout_ranks, epoch)
        self._opened[epoch] = opened
        self._forget_epochs()
        return opened

    def _forget_epochs(self) -> None:
        """Trainer 0: delete the keys of the epochs it opened before the :data:`KEEP_EPOCHS` newest (their
        members, hellos, failures and bridge-group rendezvous), so the store does not grow epoch by epoch.
        A rank still in such an epoch has failed its push already; it reads no key of it again."""
        for old in sorted(self._opened)[:-KEEP_EPOCHS]:
            roster = self._opened.pop(old)
            keys = [self._keys.members(old), self._keys.failed(old)]
            keys += [self._keys.hello(old, m.key) for m in roster.members]
            keys += [self._keys.failure(old, r.key) for r in self.cp.ranks or roster.members]
            keys += [f"{self._keys.group_prefix(old)}//0/{b}" for b in range(roster.world_size)]  # c10d's rendezvous keys
            for key in keys:
                self.cp.delete(key)

    def await_membership(self, epoch: int, deadline: float) -> Membership:
        key = self._keys.members(epoch)
        raw = self.cp.wait_for([key], deadline, f"the membership of epoch {epoch}", epoch=epoch)
        members = self.cp.parse(key, raw[0], Membership)
        if members.epoch != epoch:
            raise ProtocolError(self.me, f"the membership under {key!r} is epoch {members.epoch}'s")
        return members

    def handshake(
        self, roster: Roster, *, spec_hash: str, plan_hash: str, dtypes: str, dtype_diffs: tuple[str, ...],
        wire: str, nonce: str, expected_dtypes: Mapping[RankId, str], deadline: float, started: int = 0,
        identity: DeviceIdentity | None = None,
    ) -> dict[RankId, Hello]:
        """Publish this rank's hello for ``roster``'s epoch and check every member's (contract 3;
        a member that greeted and then joined again as a later process ends the wait). ``identity``:
        this rank's backend, host and device (the data plane's)."""
        hello = Hello(side=self.me.side, rank=self.me.rank, epoch=roster.epoch, spec_hash=spec_hash,
                      plan_hash=plan_hash, dtypes=dtypes, dtype_diffs=dtype_diffs, wire=wire, nonce=nonce,
                      started=started, identity=identity)
        return handshake(self.cp, hello, roster.members, expected_dtypes, deadline)

    def failure_count(self, epoch: int) -> int:
        """Failures of ``epoch`` seen so far by this board (the ``since`` of later waits on it)."""
        return self.cp.failure_count(epoch)

    def group_prefix(self, epoch: int) -> str:
        return self._keys.group_prefix(epoch)

    # -- pushes -----------------------------------------------------------------------------
    def announce(self, seq: int, version: int, epoch: int, started: int = 0) -> Announce:
        ann = Announce(seq=seq, version=version, epoch=epoch, started=started)
        self.cp.set(self._keys.announce, ann)
        return ann

    def announcement(self) -> Announce | None:
        """The latest announcement, or None before the first push."""
        return self.cp.get(self._keys.announce, Announce)

    def ack(self, stage: str, ann: Announce) -> None:
        """Rollout ranks: this rank has push ``ann`` ``staged`` or ``applied`` (bound to its join nonce).

        Returns once the store holds it: a driver reads the acks the moment the workers' apply
        returned (``InstanceView.applied``), on another connection, and TCPStore's ``set`` sends no
        reply, so without a round trip on this connection that read could be answered first."""
        key = self._keys.ack(stage, self.me.rank)
        self.cp.set(key, Ack(rank=self.me.rank, version=ann.version, seq=ann.seq, epoch=ann.epoch, stage=stage,
                             nonce=self.nonce))
        self.cp.exists([key])  # the round trip: this connection's requests are handled in order

    def ack_of(self, stage: str, rollout_rank: int) -> Ack | None:
        key = self._keys.ack(stage, rollout_rank)
        ack = self.cp.get(key, Ack)
        if ack is not None and (ack.rank, ack.stage) != (rollout_rank, stage):
            raise ProtocolError(self.me, f"the ack under {key!r} is rollout {ack.rank}'s {ack.stage} ack")
        return ack

    def acks(
        self, stage: str, rollout_ranks: Sequence[int], *, epoch: int | None = None,
        hellos: Mapping[RankId, Hello] | None = None,
    ) -> dict[int, Ack]:
        """The latest ``stage`` ack of each of ``rollout_ranks`` that has one.

        ``epoch`` / ``hellos`` (the trainer waiting for a push's acks): only acks of that epoch, written
        by the incarnation of the rank whose hello it handshook with (same nonce), count; a replayed
        ack of an earlier epoch or process is ignored.
        """
        out = {}
        for r in rollout_ranks:
            ack = self.ack_of(stage, r)
            if ack is None or (epoch is not None and ack.epoch != epoch):
                continue
            if hellos is not None:
                hello = hellos.get(RankId(ROLLOUT, r))
                if hello is None or ack.nonce != hello.nonce:
                    continue
            out[r] = ack
        return out

    # -- instance apply agreement (rollout ranks of one instance) -----------------------------
    def offer(self, instance: int, session: str, offer: Offer) -> None:
        self.cp.set(self._keys.offer(instance, session, offer.round, self.me.rank), offer)

    def withdraw_offer(self, instance: int, session: str, round: int) -> None:
        self.cp.delete(self._keys.offer(instance, session, round, self.me.rank))

    def offer_keys(self, instance: int, session: str, round: int, rollout_ranks: Sequence[int]) -> list[str]:
        return [self._keys.offer(instance, session, round, r) for r in rollout_ranks]


def rollout_ids(ranks: Sequence[int]) -> list[RankId]:
    return [RankId(ROLLOUT, r) for r in ranks]
