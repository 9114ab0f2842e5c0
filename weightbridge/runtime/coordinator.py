"""Every decision of the runtime's protocol, as pure functions of a snapshot (no store, no clock, no torch).

The bridges (:mod:`.trainer`, :mod:`.rollout`, :mod:`.instance`) read the control store into the
snapshot types below, call one of these functions and act on the returned decision (a frozen
dataclass). Nothing here waits or does I/O, so each rule is tested as a table of
snapshot -> decision rows (``tests/sync/test_coordinator.py``).

Who calls what:

* trainer rank 0, per push: :func:`decide_members` (who is a member: complete instances with live
  heartbeats, at least ``min_instances``), :func:`decide_staleness` (async: may the push start),
  :func:`decide_push` (reuse the epoch or open a new one, and what to announce);
* every trainer rank: :func:`ack_stage` and :func:`pending_acks` (when ``push`` returns);
  ranks > 0: :func:`accepts_announcement` (is the announcement the one for my ``push(v)``);
* every rollout rank: :func:`receives` (is an announcement a push for me);
* every rollout rank of a multi-rank instance: :func:`decide_instance_apply` (which version the
  instance's ranks apply together, see :mod:`weightbridge.runtime.instance`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from weightbridge.sync.messages import Offer
from weightbridge.sync.roster import RankId

# ---------------------------------------------------------------------------------------------
# membership (trainer rank 0)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutView:
    """What trainer 0 saw of the rollout side at one moment (spec numbering)."""

    instances: tuple[tuple[int, ...], ...]  # the spec rollout ranks of each spec instance
    joined: frozenset[int] = frozenset()  # rollout ranks with a join record
    dead: frozenset[int] = frozenset()  # rollout ranks whose heartbeat stopped (or known dead)


@dataclass(frozen=True)
class Members:
    """Enough instances are present: the push goes to ``instances`` (spec indices, ascending)."""

    instances: tuple[int, ...]


@dataclass(frozen=True)
class AwaitInstances:
    """Fewer than ``need`` complete, live instances (``have``): keep waiting (up to the deadline)."""

    have: tuple[int, ...]
    need: int


def live_instances(view: RolloutView) -> tuple[int, ...]:
    """Instances every rank of which joined and none is known dead."""
    return tuple(
        i for i, ranks in enumerate(view.instances)
        if all(r in view.joined for r in ranks) and not any(r in view.dead for r in ranks)
    )


def decide_members(view: RolloutView, min_instances: int) -> Members | AwaitInstances:
    have = live_instances(view)
    return Members(have) if len(have) >= min_instances else AwaitInstances(have, min_instances)


# ---------------------------------------------------------------------------------------------
# staleness (trainer rank 0, async mode)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fresh:
    """Every receiver that staged anything applied at least ``bound``: the push may start."""

    bound: int


@dataclass(frozen=True)
class AwaitStaleness:
    """``lagging`` receivers applied less than ``bound`` (or nothing yet): wait for them."""

    bound: int
    lagging: tuple[int, ...]


def decide_staleness(
    version: int, max_staleness: int, staged: Sequence[int], applied: Mapping[int, int]
) -> Fresh | AwaitStaleness:
    """Async ``push(version)``: receivers in ``staged`` (ranks that staged something) must have
    applied ``>= version - max(max_staleness, 1)`` (``applied``: rank -> last applied version)."""
    bound = version - max(max_staleness, 1)
    lagging = tuple(r for r in staged if applied.get(r, bound - 1) < bound)
    return AwaitStaleness(bound, lagging) if lagging else Fresh(bound)


# ---------------------------------------------------------------------------------------------
# epochs and announcements (trainer rank 0)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochView:
    """Trainer 0's current epoch as seen now."""

    epoch: int = 0
    instances: tuple[int, ...] | None = None  # None: no epoch entered yet
    broken: bool = False  # a push failed in it (its bridge group is unusable)
    failures: int = 0  # failures published in it so far
    hello_nonces: Mapping[RankId, str] = field(default_factory=dict)  # each member's nonce at the handshake
    join_nonces: Mapping[RankId, str | None] = field(default_factory=dict)  # each member's nonce now (None: gone)


@dataclass(frozen=True)
class StartPush:
    """Announce push ``seq`` of ``version`` to ``instances``; in the current epoch, or a new one (``reason``)."""

    seq: int
    version: int
    instances: tuple[int, ...]
    reason: str  # why a new epoch starts; '' = the push reuses the current epoch

    @property
    def new_epoch(self) -> bool:
        return bool(self.reason)


def epoch_change(current: EpochView, instances: tuple[int, ...]) -> str:
    """Why a push to ``instances`` needs a new epoch ('' if it does not)."""
    if current.instances is None:
        return "first push"
    if current.broken or current.failures > 0:
        return f"recovery after a failure in epoch {current.epoch}"
    if instances != current.instances:
        return f"rollout instances {list(current.instances)} -> {list(instances)}"
    for who in sorted(current.hello_nonces, key=lambda r: (r.side != "trainer", r.rank)):
        if current.join_nonces.get(who) != current.hello_nonces[who]:
            return f"{who} reconnected"
    return ""


def decide_push(current: EpochView, *, last_seq: int, version: int, instances: tuple[int, ...]) -> StartPush:
    return StartPush(last_seq + 1, version, instances, epoch_change(current, instances))


def accepts_announcement(
    ann_seq: int, ann_version: int, *, last_seq: int, version: int, failures_in_epoch: int
) -> bool:
    """Trainer ranks > 0 in ``push(version)``: is this announcement the one to send for?

    A newer push of the same version; for a fresh process (``last_seq`` 0) not one whose epoch
    already has failures (that was the failed attempt a restarted rank replaces, not the retry).
    """
    if ann_seq <= last_seq or ann_version != version:
        return False
    return not (last_seq == 0 and failures_in_epoch > 0)


def ack_stage(mode: str, max_staleness: int) -> str:
    """What ``push`` waits for: ``applied`` (sync, and async with ``max_staleness`` 0) or ``staged``."""
    return "applied" if mode != "async" or max_staleness == 0 else "staged"


def pending_acks(acks: Mapping[int, int], ranks: Sequence[int], seq: int) -> tuple[int, ...]:
    """Rollout ranks whose latest ack (rank -> acked push seq) is older than push ``seq``."""
    return tuple(r for r in ranks if acks.get(r, -1) < seq)


def receives(ann_seq: int | None, handled_seq: int) -> bool:
    """Rollout ranks: is the announcement (None: none yet) a push not handled yet?"""
    return ann_seq is not None and ann_seq > handled_seq


# ---------------------------------------------------------------------------------------------
# instance apply agreement (the rollout ranks of one instance)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyStaged:
    """Every rank holds ``version`` staged: all apply it now."""

    version: int


@dataclass(frozen=True)
class AlreadyLive:
    """Nothing is staged and every rank already serves ``version`` (>= the wanted one)."""

    version: int


@dataclass(frozen=True)
class NothingCommon:
    """No version wanted and none staged by every rank: return without applying."""


@dataclass(frozen=True)
class Retry:
    """Not yet: ranks are still receiving; run another round."""


@dataclass(frozen=True)
class RankFailed:
    """Rollout rank ``rank`` (spec numbering) reported ``error`` (``"Type: message"``): all raise."""

    rank: int
    error: str


@dataclass(frozen=True)
class TooLate:
    """A rank's deadline passed before every rank staged the wanted version; ``lagging`` did not."""

    want: int
    lagging: tuple[int, ...]


InstanceDecision = Union[ApplyStaged, AlreadyLive, NothingCommon, Retry, RankFailed, TooLate]


def decide_instance_apply(offers: Sequence[Offer], want: int | None) -> InstanceDecision:
    """One round: the ranks' :class:`~weightbridge.sync.messages.Offer` s -> what every rank does.

    Every rank evaluates this on the same offers, so all take the same branch. ``want`` None:
    apply a version every rank has staged, if any (one round, never waits); ``want`` v: apply
    the version staged by all once it is ``>= v``, retrying until a rank is late.
    """
    ordered = sorted(offers, key=lambda o: o.rank)
    for o in ordered:
        if o.error is not None:
            return RankFailed(o.rank, o.error)
    staged = {o.staged for o in ordered}
    if len(staged) == 1 and None not in staged:
        (v,) = staged
        if want is None or v >= want:  # type: ignore[operator]
            return ApplyStaged(v)  # type: ignore[arg-type]
    if want is None:
        return NothingCommon()
    live = {o.live for o in ordered}
    if staged == {None} and len(live) == 1 and None not in live:
        (v,) = live
        if v >= want:  # type: ignore[operator]
            return AlreadyLive(v)  # type: ignore[arg-type]
    if any(o.late for o in ordered):
        target = max([want] + [o.staged for o in ordered if o.staged is not None])
        return TooLate(want, tuple(o.rank for o in ordered if o.staged is None or o.staged < target))
    return Retry()
