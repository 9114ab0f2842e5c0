"""The coordinator's decisions as tables: snapshot -> expected decision (no store, no threads, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weightbridge.runtime import coordinator as co
from weightbridge.sync.messages import Offer
from weightbridge.sync.roster import RankId

T0, T1, R0, R1, R2, R3 = (RankId("trainer", 0), RankId("trainer", 1), RankId("rollout", 0), RankId("rollout", 1),
                          RankId("rollout", 2), RankId("rollout", 3))
TWO_TP2 = ((0, 1), (2, 3))  # two instances of two ranks each (spec rollout ranks)


def view(joined=(), dead=(), instances=TWO_TP2):
    return co.RolloutView(instances, frozenset(joined), frozenset(dead))


# -- who is a member -----------------------------------------------------------------------------
MEMBERS = [
    # (joined, dead, min_instances, expected)
    ((), (), 1, co.AwaitInstances((), 1)),
    ((0,), (), 1, co.AwaitInstances((), 1)),  # instance 0 incomplete
    ((0, 1), (), 1, co.Members((0,))),
    ((0, 1), (), 2, co.AwaitInstances((0,), 2)),
    ((0, 1, 2, 3), (), 2, co.Members((0, 1))),
    ((0, 1, 2, 3), (), 1, co.Members((0, 1))),  # every complete instance is a member, not just the minimum
    ((0, 1, 2, 3), (3,), 1, co.Members((0,))),  # a dead rank drops its whole instance
    ((0, 1, 2, 3), (3,), 2, co.AwaitInstances((0,), 2)),
    ((0, 1, 2, 3), (0, 2), 1, co.AwaitInstances((), 1)),
    ((2, 3), (), 1, co.Members((1,))),  # a late instance 0: instance 1 alone
    ((1, 2, 3), (1,), 1, co.Members((1,))),
]


@pytest.mark.parametrize("joined,dead,need,want", MEMBERS)
def test_decide_members(joined, dead, need, want):
    assert co.decide_members(view(joined, dead), need) == want


def test_live_instances_of_one_rank_instances():
    assert co.live_instances(view((0, 2), (), instances=((0,), (1,), (2,)))) == (0, 2)


# -- the staleness bound (async): over versions each receiver's current process staged --------------
INC = co.Incarnation


STALENESS = [
    # (max_staleness, records: rank -> Incarnation, applied: rank -> (seq, version), expected)
    (1, {}, {}, co.Fresh()),
    (1, {0: INC("a", 0)}, {}, co.Fresh()),  # staged nothing yet: nothing to wait for
    (1, {0: INC("a", 0, ((1, 1),))}, {0: (1, 1)}, co.Fresh()),
    (1, {0: INC("a", 0, ((1, 1),))}, {}, co.AwaitStaleness(((0, 1, None),))),  # staged, never applied
    (1, {0: INC("a", 0, ((1, 1), (2, 2)))}, {0: (1, 1)}, co.AwaitStaleness(((0, 2, 1),))),
    (2, {0: INC("a", 0, ((1, 1), (2, 2)))}, {0: (1, 1)}, co.Fresh()),  # k = 2: one behind is fine
    (2, {0: INC("a", 0, ((1, 1),))}, {}, co.Fresh()),  # fewer than k delivered: not waited for
    (0, {0: INC("a", 0, ((1, 1),))}, {0: (1, 1)}, co.Fresh()),  # k = 0 waits like k = 1 here
    # versions never delivered (a failed push 2, never announced: numbers 1 and 3) are not waited for
    (1, {0: INC("a", 0, ((1, 1), (3, 3)))}, {0: (3, 3)}, co.Fresh()),
    (1, {0: INC("a", 0, ((1, 1), (3, 5)))}, {0: (1, 1)}, co.AwaitStaleness(((0, 5, 1),))),
    # an applied ack of an earlier process of the rank (seq not past since_seq) does not count
    (1, {0: INC("b", 4, ((5, 5),))}, {0: (4, 4)}, co.AwaitStaleness(((0, 5, None),))),
    (1, {0: INC("b", 4, ((5, 5),)), 1: None, 2: INC("c", 0, ((5, 5),))}, {0: (5, 5), 2: (5, 5)}, co.Fresh()),
    (1, {3: INC("a", 0, ((2, 2),)), 1: INC("a", 0, ((2, 2),))}, {}, co.AwaitStaleness(((1, 2, None), (3, 2, None)))),
]


@pytest.mark.parametrize("k,records,applied,want", STALENESS)
def test_decide_staleness(k, records, applied, want):
    assert co.decide_staleness(k, records, applied) == want


def test_a_restarted_receiver_starts_a_new_record_and_a_missing_join_keeps_the_old():
    old = INC("a", 0, ((1, 1),))
    assert co.track_incarnation(old, "a", 5) is old
    assert co.track_incarnation(old, "b", 5) == INC("b", 5)  # a restart: nothing delivered to it yet
    assert co.track_incarnation(old, None, 5) is old  # join key gone: it rejoins with the same nonce
    assert co.track_incarnation(None, None, 5) is None
    assert co.track_incarnation(None, "a", 2) == INC("a", 2)


AFTER_PUSH = [
    # (record, push seq, version, staged ack seq, expected staged)
    (INC("a", 0), 1, 1, 1, ((1, 1),)),
    (INC("a", 0, ((1, 1),)), 2, 2, 2, ((1, 1), (2, 2))),
    (INC("a", 0, ((1, 1), (2, 2))), 3, 3, 3, ((2, 2), (3, 3))),  # the last `keep` (2)
    (INC("a", 0, ((1, 1),)), 2, 2, 1, ()),  # did not stage push 2: its staged copy may be gone
    (INC("a", 0, ((1, 1),)), 2, 2, None, ()),
    (INC("a", 2, ()), 2, 2, 2, ()),  # joined after push 2 was fixed: an earlier process' ack
]


@pytest.mark.parametrize("record,seq,version,staged_seq,staged", AFTER_PUSH)
def test_after_push(record, seq, version, staged_seq, staged):
    got = co.after_push(record, seq=seq, version=version, staged_seq=staged_seq, keep=2)
    assert got.staged == staged and (got.nonce, got.since_seq) == (record.nonce, record.since_seq)


def test_async_heals_after_a_push_that_timed_out_in_the_staleness_wait():
    """The issue's reproducer as a table walk: 1 receiver, k = 1, push 2 never announced."""
    rec = co.after_push(INC("a", 0), seq=1, version=1, staged_seq=1, keep=2)
    assert co.decide_staleness(1, {0: rec}, {}) == co.AwaitStaleness(((0, 1, None),))  # push 2 waits, times out
    # version 2 was never announced; the slow apply of 1 lands: push 3 may start
    assert co.decide_staleness(1, {0: rec}, {0: (1, 1)}) == co.Fresh()


# -- epochs and what to announce -----------------------------------------------------------------
def epoch(instances=(0, 1), broken=False, failures=0, hellos=None, joins=None, e=3):
    hellos = {T0: "a", R0: "b"} if hellos is None else hellos
    return co.EpochView(epoch=e, instances=instances, broken=broken, failures=failures, hello_nonces=hellos,
                        join_nonces=dict(hellos) if joins is None else joins)


EPOCHS = [
    # (current epoch, instances of this push, expected reason)
    (co.EpochView(), (0, 1), "first push"),
    (epoch(), (0, 1), ""),
    (epoch(broken=True), (0, 1), "recovery after a failure in epoch 3"),
    (epoch(failures=2), (0, 1), "recovery after a failure in epoch 3"),
    (epoch(), (0,), "rollout instances [0, 1] -> [0]"),
    (epoch(instances=(1,)), (0, 1), "rollout instances [1] -> [0, 1]"),
    (epoch(joins={T0: "a", R0: "new"}), (0, 1), "rollout 0 reconnected"),
    (epoch(joins={T0: "a", R0: None}), (0, 1), "rollout 0 reconnected"),  # left
    (epoch(joins={T0: "x", R0: "y"}), (0, 1), "trainer 0 reconnected"),  # trainers are named first
    (epoch(broken=True), (0,), "recovery after a failure in epoch 3"),  # recovery wins over a change
]


@pytest.mark.parametrize("current,instances,reason", EPOCHS)
def test_epoch_change_and_the_push_decision(current, instances, reason):
    assert co.epoch_change(current, instances) == reason
    d = co.decide_push(current, last_seq=7, version=12, instances=instances)
    assert d == co.StartPush(8, 12, instances, reason) and d.new_epoch == bool(reason)


ANNOUNCEMENTS = [
    # (announced (epoch, seq, version), my last (epoch, seq), my version, failures in its epoch, mine?)
    ((2, 5, 9), (2, 4), 9, 0, True),
    ((2, 5, 9), (2, 5), 9, 0, False),  # already handled
    ((2, 5, 8), (2, 4), 9, 0, False),  # another version: rank 0 is still deciding mine
    ((1, 1, 9), None, 9, 0, True),
    ((1, 3, 9), None, 9, 1, False),  # a restarted rank: the failed attempt, not the retry
    ((3, 6, 9), (2, 4), 9, 2, True),  # not fresh: failures concern earlier pushes
    ((3, 1, 9), (2, 10**12), 9, 0, True),  # after a bogus seq of 10**12, a real announcement still counts
    ((1, 1, 9), (4, 7), 9, 0, True),  # a restarted trainer 0 numbering from 1
]


@pytest.mark.parametrize("ann,last,mine,failures,accepted", ANNOUNCEMENTS)
def test_accepts_announcement(ann, last, mine, failures, accepted):
    assert co.accepts_announcement(ann, last=last, version=mine, failures_in_epoch=failures) is accepted


@pytest.mark.parametrize("mode,k,stage", [("sync", 1, "applied"), ("colocated", 1, "applied"),
                                          ("async", 0, "applied"), ("async", 1, "staged"), ("async", 3, "staged")])
def test_ack_stage(mode, k, stage):
    assert co.ack_stage(mode, k) == stage


@pytest.mark.parametrize("acks,ranks,seq,pending", [
    ({}, (0, 1), 1, (0, 1)),
    ({0: 1, 1: 1}, (0, 1), 1, ()),
    ({0: 2, 1: 1}, (0, 1), 2, (1,)),
    ({0: 5, 1: 5, 2: 4}, (0, 2), 5, (2,)),  # only the epoch's ranks count
])
def test_pending_acks(acks, ranks, seq, pending):
    assert co.pending_acks(acks, ranks, seq) == pending


@pytest.mark.parametrize("ann,handled,yes", [  # (epoch, seq, trainer 0's start)
    (None, None, False), ((1, 1, 5), None, True), ((1, 3, 5), (1, 3, 5), False), ((1, 4, 5), (1, 3, 5), True),
    ((2, 1, 5), (1, 7, 5), True),  # a new epoch numbering lower
    ((1, 2, 5), (1, 3, 5), False), ((1, 9, 5), (2, 1, 5), False),  # a replayed older announcement: ignored
    ((1, 1, 9), (4, 7, 5), True),  # a restarted trainer 0 (epoch reused, e.g. its memory of epochs was lost)
    ((1, 4, 5), (1, 10**12, 0), True),  # after a bogus seq written with the secret, a later trainer 0 still wins
    (None, (1, 3, 5), False),
])
def test_receives(ann, handled, yes):
    assert co.receives(ann, handled) is yes


R = RankId
ROOT_CAUSES = [
    # (published failures (rank, type, message), me, expected cause)
    ([], T0, None),
    ([(T0, "ValueError", "mine")], T0, None),  # my own failure explains nothing
    ([(R1, "PeerDisconnected", "x"), (R0, "ChecksumError", "bad crc")], T0, co.Cause(R0, "ChecksumError: bad crc", True)),
    ([(R1, "PeerDisconnected", "x")], T0, co.Cause(R1, "PeerDisconnected: x", False)),  # only a symptom
    ([(T1, "DeadlineExceeded", "late"), (R2, "RuntimeError", "engine")], R0, co.Cause(R2, "RuntimeError: engine", True)),
]


@pytest.mark.parametrize("failures,me,want", ROOT_CAUSES)
def test_root_cause(failures, me, want):
    assert co.root_cause(failures, me) == want


# -- instance apply agreement --------------------------------------------------------------------
def off(rank, staged, live=None, late=False, error=None):
    return Offer(rank=rank, round=0, staged=staged, live=live, late=late, error=error)


INSTANCE = [
    # (offers, wanted version, expected decision)
    ([off(0, 3), off(1, 3)], 3, co.ApplyStaged(3)),
    ([off(0, 4), off(1, 4)], 3, co.ApplyStaged(4)),  # newer than wanted: applied
    ([off(0, 3), off(1, 3)], None, co.ApplyStaged(3)),
    ([off(0, 3), off(1, 2)], 3, co.Retry()),  # rank 1 still receiving 3
    ([off(0, 3), off(1, None)], 3, co.Retry()),  # rank 1's receive in flight
    ([off(0, 3), off(1, 2)], None, co.NothingCommon()),  # no common version: never waits
    ([off(0, None), off(1, None)], None, co.NothingCommon()),
    ([off(0, 2), off(1, 2)], 3, co.Retry()),  # both have an older one: wait for 3
    ([off(0, None, 3), off(1, None, 3)], 3, co.AlreadyLive(3)),  # applied already
    ([off(0, None, 3), off(1, None, 2)], 3, co.Retry()),
    ([off(0, None, 2), off(1, None, 2)], 3, co.Retry()),
    ([off(0, 3), off(1, None, late=True)], 3, co.TooLate(3, (1,))),
    ([off(0, 3, late=True), off(1, 2)], 3, co.TooLate(3, (1,))),  # anyone late: all stop together
    ([off(0, 4), off(1, 3, late=True)], 3, co.TooLate(3, (1,))),  # lagging = behind the newest staged
    ([off(2, None, late=True), off(3, None)], 5, co.TooLate(5, (2, 3))),
    ([off(0, 3), off(1, 3, late=True)], 3, co.ApplyStaged(3)),  # agreement wins over lateness
    ([off(0, 3), off(1, None, error="PeerTimeout: x")], 3, co.RankFailed(1, "PeerTimeout: x")),
    ([off(1, None, error="B: y"), off(0, None, error="A: x")], None, co.RankFailed(0, "A: x")),  # lowest rank
    ([off(0, 3, error="A: x"), off(1, 3)], 3, co.RankFailed(0, "A: x")),  # an error wins over agreement
    ([off(5, 7)], 7, co.ApplyStaged(7)),  # one-rank instance
    ([off(5, None, 6)], 7, co.Retry()),
]


@pytest.mark.parametrize("offers,want,decision", INSTANCE)
def test_decide_instance_apply(offers, want, decision):
    offers = [o.model_copy(update={"want": want}) for o in offers]  # every rank in the same call
    assert co.decide_instance_apply(offers) == decision
    assert co.decide_instance_apply(list(reversed(offers))) == decision  # order-independent


_versions = st.none() | st.integers(0, 3)
_offers = st.lists(st.builds(lambda staged, live, late, want, err: (staged, live, late, want, err), _versions, _versions,
                             st.booleans(), _versions, st.sampled_from([None, "E: x"])), min_size=1, max_size=4)


@given(_offers)
def test_an_instance_decision_is_the_same_whichever_rank_evaluates_it_and_applies_only_what_all_want(rows):
    offers = [Offer(rank=i, round=0, staged=s, live=lv, late=la, want=w, error=e)
              for i, (s, lv, la, w, e) in enumerate(rows)]
    decision = co.decide_instance_apply(offers)
    assert co.decide_instance_apply(offers[::-1]) == decision
    if isinstance(decision, (co.ApplyStaged, co.AlreadyLive)):
        (want,) = {o.want for o in offers}  # an apply needs one wanted version
        assert want is None or decision.version >= want
        if isinstance(decision, co.ApplyStaged):
            assert {o.staged for o in offers} == {decision.version}


def test_ranks_that_want_different_versions_in_one_round_all_raise_and_none_applies():
    # rollout 2 is still in its call for v1 (late), rollout 3 already in its call for v2: both staged v1.
    # Deciding with each rank's own want split the instance (2 applied v1, 3 raised TooLate).
    offers = [off(2, 1, late=True).model_copy(update={"want": 1}), off(3, 1).model_copy(update={"want": 2})]
    assert co.decide_instance_apply(offers) == co.WantsDiffer(((2, 1), (3, 2)))
    assert co.decide_instance_apply(offers[::-1]) == co.WantsDiffer(((2, 1), (3, 2)))
    none_and_v = [off(0, 3).model_copy(update={"want": None}), off(1, 3).model_copy(update={"want": 3})]
    assert co.decide_instance_apply(none_and_v) == co.WantsDiffer(((0, None), (1, 3)))
    failed = [off(0, None, error="A: x").model_copy(update={"want": 1}), off(1, 1).model_copy(update={"want": 2})]
    assert co.decide_instance_apply(failed) == co.RankFailed(0, "A: x")  # a failed receive says more


def test_the_coordinator_is_pure():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(co.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in imported if m.split(".")[0] in ("torch", "time", "threading", "socket")}
    assert not {m for m in imported if m.startswith(("weightbridge.sync.control", "weightbridge.sync.board",
                                                     "weightbridge.transport"))}
