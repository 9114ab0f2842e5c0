"""Every decision of the runtime's protocol, as pure functions of a snapshot (no store, no clock, no torch).

The bridges (:mod:`.trainer`, :mod:`.rollout`, :mod:`.instance`) read the control store into the
snapshot types below, call one of these functions and act on the returned decision (a frozen
dataclass). Nothing here waits or does I/O, so each rule is tested as a table of
snapshot -> decision rows (``tests/sync/test_coordinator.py``).

Who calls what:

* trainer rank 0, per push: :func:`decide_members` (who is a member: complete instances with live
  heartbeats, at least ``min_instances``), :func:`track_incarnation` / :func:`after_push` (what each
  receiver's current process was delivered) and :func:`decide_staleness` (async: may the push start),
  :func:`decide_push` (reuse the epoch or open a new one, and what to announce);
* every trainer rank: :func:`ack_stage` and :func:`pending_acks` (when ``push`` returns);
  ranks > 0: :func:`accepts_announcement` (is the announcement the one for my ``push(v)``);
  after a transport error: :func:`root_cause` (the failure a peer published that explains it);
* every rollout rank: :func:`receives` (is an announcement a push for me), :func:`root_cause`;
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
# staleness (trainer rank 0, async mode): counted over versions actually delivered
# ---------------------------------------------------------------------------------------------
#
# Version numbers say nothing about delivery: a push that failed or was never announced delivered
# nothing, so a bound of ``version - k`` could wait for a version nobody can ever apply (the
# bridge jammed for good after one failed push). Trainer 0 instead remembers, per receiver
# *process* (its join nonce), the versions that process staged, and waits for the k-th newest.


@dataclass(frozen=True)
class Incarnation:
    """Trainer 0's memory of one rollout rank's current process (one join nonce).

    ``since_seq``: the last push trainer 0 had announced when it first saw this nonce; acks with a
    seq not above it were written by an earlier process of the rank and are ignored.
    ``staged``: ``(seq, version)`` of the pushes this process staged, oldest first (the last few),
    since the last push to it that it did not stage (which may have overwritten its staged copy).
    """

    nonce: str
    since_seq: int
    staged: tuple[tuple[int, int], ...] = ()


def track_incarnation(record: Incarnation | None, nonce: str | None, last_seq: int) -> Incarnation | None:
    """The record of the rank's process now: a new, empty one when its join nonce changed (a restart).

    ``nonce`` None (join record missing or unreadable): keep what was known (the rank rejoins).
    """
    if nonce is None:
        return record
    if record is None or record.nonce != nonce:
        return Incarnation(nonce, last_seq)
    return record


def after_push(record: Incarnation, *, seq: int, version: int, staged_seq: int | None, keep: int) -> Incarnation:
    """Push ``seq`` (``version``) to this rank ended (success or not); ``staged_seq``: its staged ack's seq.

    Staged it: remember it (the last ``keep``). Did not: forget everything it staged before, since
    the failed receive may have replaced its staged copy; waiting for those could never end.
    """
    if record.since_seq >= seq:
        return record  # this process joined after push seq was fixed: it was not a receiver
    if staged_seq == seq:
        return Incarnation(record.nonce, record.since_seq, (record.staged + ((seq, version),))[-keep:])
    return Incarnation(record.nonce, record.since_seq, ())


@dataclass(frozen=True)
class Fresh:
    """Every receiver applied a recent enough delivered version: the push may start."""


@dataclass(frozen=True)
class AwaitStaleness:
    """``lagging``: ``(rollout rank, version it must apply, version it applied or None)``; wait for them."""

    lagging: tuple[tuple[int, int, int | None], ...]

    @property
    def bound(self) -> int:
        return max(need for _, need, _ in self.lagging)


def decide_staleness(
    max_staleness: int, records: Mapping[int, Incarnation | None], applied: Mapping[int, tuple[int, int]]
) -> Fresh | AwaitStaleness:
    """Async: each receiver (rank -> its :class:`Incarnation`) must have applied at least the
    ``max(max_staleness, 1)``-th newest version its current process staged (``applied``: rank ->
    ``(seq, version)`` of its latest applied ack; one of an earlier process does not count).
    A receiver that staged fewer versions than that is not waited for."""
    k = max(max_staleness, 1)
    lagging = []
    for rank in sorted(records):
        rec = records[rank]
        if rec is None or len(rec.staged) < k:
            continue
        need = rec.staged[-k][1]
        got = applied.get(rank)
        has = got[1] if got is not None and got[0] > rec.since_seq else None
        if has is None or has < need:
            lagging.append((rank, need, has))
    return AwaitStaleness(tuple(lagging)) if lagging else Fresh()


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
    ann: tuple[int, int, int], *, last: tuple[int, int] | None, version: int, failures_in_epoch: int
) -> bool:
    """Trainer ranks > 0 in ``push(version)``: is announcement ``(epoch, seq, version)`` the one to send for?

    One for my version that I have not handled (``last``: the ``(epoch, seq)`` I sent for last, None
    for a fresh process); for a fresh process not one whose epoch already has failures (that was
    the failed attempt a restarted rank replaces, not the retry). Compared for *change*, not
    order, so that no value (a seq of 10**12, a restarted trainer 0 numbering from 1) can make a
    rank ignore every later announcement.
    """
    epoch, seq, ann_version = ann
    if ann_version != version or (epoch, seq) == last:
        return False
    return not (last is None and failures_in_epoch > 0)


def ack_stage(mode: str, max_staleness: int) -> str:
    """What ``push`` waits for: ``applied`` (sync, and async with ``max_staleness`` 0) or ``staged``."""
    return "applied" if mode != "async" or max_staleness == 0 else "staged"


def pending_acks(acks: Mapping[int, int], ranks: Sequence[int], seq: int) -> tuple[int, ...]:
    """Rollout ranks whose latest ack (rank -> acked push seq) is older than push ``seq``."""
    return tuple(r for r in ranks if acks.get(r, -1) < seq)


def receives(ann: tuple[int, int, int] | None, handled: tuple[int, int, int] | None) -> bool:
    """Rollout ranks: is announcement ``(epoch, seq, started)`` (None: none yet) a push not handled yet?

    Genuine announcements only move forward: within one trainer 0 process ``(epoch, seq)`` grows
    (epochs are never reused), and a restarted trainer 0 has a later ``started``. So a push is new
    when it is later than the last one handled in either sense; a replayed older announcement (only
    a value written with the job secret is read at all) is ignored: receiving it would take the
    bytes of the push in flight for that old version.
    """
    if ann is None:
        return False
    if handled is None:
        return True
    return ann[:2] > handled[:2] or ann[2] > handled[2]


# ---------------------------------------------------------------------------------------------
# the cause of a transport error (every rank of an epoch)
# ---------------------------------------------------------------------------------------------

# Errors that are symptoms of another rank's failure (it closed its sockets, stopped answering).
SYMPTOMS = frozenset({"PeerDisconnected", "PeerTimeout", "PeerFailed", "DeadlineExceeded"})


@dataclass(frozen=True)
class Cause:
    """The failure ``peer`` published (``error``: ``"Type: message"``); ``root``: not itself a symptom."""

    peer: RankId
    error: str
    root: bool


def root_cause(failures: Sequence[tuple[RankId, str, str]], me: RankId) -> Cause | None:
    """Among failures published in the epoch (``(rank, error type, message)``, in order), the one
    that explains a transport error on ``me``: the first that is not a symptom, else the first of
    another rank, else None."""
    others = [f for f in failures if f[0] != me]
    for who, error, message in others:
        if error not in SYMPTOMS:
            return Cause(who, f"{error}: {message}", True)
    if others:
        who, error, message = others[0]
        return Cause(who, f"{error}: {message}", False)
    return None


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


@dataclass(frozen=True)
class WantsDiffer:
    """The ranks asked for different versions in one round (``wants``: ``(rank, want)`` by rank): they
    are not in the same ``apply_instance`` call (a caller bug, or a rank that missed a call). All
    raise; nothing is applied."""

    wants: tuple[tuple[int, int | None], ...]


InstanceDecision = Union[ApplyStaged, AlreadyLive, NothingCommon, Retry, RankFailed, TooLate, WantsDiffer]


def decide_instance_apply(offers: Sequence[Offer]) -> InstanceDecision:
    """One round: the ranks' :class:`~weightbridge.sync.messages.Offer` s -> what every rank does.

    A pure function of the offers (the wanted version included), so every rank, evaluating the
    same offers, takes the same branch. Wanted version None: apply a version every rank has
    staged, if any (one round, never waits); v: apply the version staged by all once it is
    ``>= v``, retrying until a rank is late. A failed receive wins, then differing wants.
    """
    ordered = sorted(offers, key=lambda o: o.rank)
    for o in ordered:
        if o.error is not None:
            return RankFailed(o.rank, o.error)
    if len({o.want for o in ordered}) > 1:
        return WantsDiffer(tuple((o.rank, o.want) for o in ordered))
    want = ordered[0].want if ordered else None
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
