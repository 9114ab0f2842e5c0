"""Instance-level apply over real Gloo processes: the ranks of one instance apply one version together.

Also: after a membership change (instance 0 absent, so rollout 2 and 3 are the epoch's plan ranks 0
and 1), errors still name spec ranks.
"""

from __future__ import annotations

import pytest

import sync_instance_workers as W
from weightbridge.localrun import launch
from weightbridge.tensors import empty_like_layout
from weightbridge.transport.store import open_store

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def run(procs, timeout_s=60):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    args = [(role, text, rank, store.port, opts) for role, text, rank, opts in procs]
    res = launch(W.main, args, timeout_s=timeout_s)
    for r in res:
        assert r.ok or r.exitcode == -9, (r.error, r.traceback, r.timed_out, r.exitcode)
    return res


def kinds(events, kind):
    return [e for e in events if e[0] == kind]


def test_ranks_that_stage_at_different_times_apply_the_same_version_together():
    text = W.spec(mode="async")
    wants = [(1, 15.0), (2, 15.0)]
    res = run([
        ("trainer", text, 0, {"versions": [1, 2], "linger_key": "test/done/2"}),
        ("rollout", text, 2, {"wants": wants, "wait_for": [3]}),
        ("rollout", text, 3, {"wants": wants, "slow": (1, 1.5), "wait_for": [2]}),  # stages v1 ~1.5 s later
    ])
    fast, slow = res[1].value, res[2].value
    for ev in (fast, slow):
        assert [(e[1], e[2], e[4]) for e in kinds(ev, "applied")] == [(1, 1, []), (2, 2, [])], ev
    slow_staged_v1 = kinds(slow, "rounds")[0][1][:len(kinds(slow, "rounds")[0][1]) // 2][-1]
    assert kinds(fast, "applied")[0][3] >= slow_staged_v1  # rollout 2 waited for rollout 3's copy of v1


def test_a_rank_that_never_stages_keeps_both_from_applying_and_both_time_out_naming_it():
    # One round: rollout 3's hook sleeps after it received everything, so the trainer and rollout 2 finish.
    text = W.spec(mode="async", round_bytes="1MiB", dedup="off")
    res = run([
        ("trainer", text, 0, {"versions": [1], "linger_key": "test/done/3"}),
        ("rollout", text, 2, {"wants": [(1, 4.0)], "wait_for": [3]}),
        ("rollout", text, 3, {"wants": [(1, 4.0)], "slow": (1, 8.0), "wait_for": [2]}),
    ])
    for ev in (res[1].value, res[2].value):
        (err,) = kinds(ev, "error")
        _, want, etype, msg, waited, version = err
        assert etype == "DeadlineExceeded" and "not staged on rollout 3" in msg, msg
        assert "instance 1" in msg and version is None and waited < 8  # neither applied
        assert kinds(ev, "applied") == []


def test_after_a_membership_change_a_transport_error_names_the_spec_rank():
    text = W.spec(mode="sync", round_bytes="8KiB", timeout_s=6.0)
    res = run([
        ("trainer", text, 0, {"versions": [1]}),
        ("rollout", text, 2, {"poll_s": 8.0}),
        ("rollout", text, 3, {"poll_s": 8.0, "kill": 1}),  # dies mid-receive
    ], timeout_s=45)
    assert res[2].exitcode == -9
    (err,) = kinds(res[0].value, "error")
    msg = err[3]
    assert "rollout 3" in msg and "rollout rank 1" not in msg, msg  # spec numbering, not the epoch's plan's


# -- streaming ranks (tensors=None): the engine is written during the receive --------------------------
@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_streaming_ranks_write_each_version_into_the_engine_during_the_receive_bitwise(transport):
    """In place, no live tensors: every local tensor goes to the sink once per version, complete and
    bitwise; the ranks keep no wire slab between updates and never held the whole shard at once. Over
    ``shm`` (the colocated plane, every pair on this host) the ranks stream straight from the trainer's
    slab, allocating no slab of their own."""
    text = W.spec(mode="sync", round_bytes="16KiB", dedup="off", transport=transport)
    wants = [(1, 15.0), (2, 15.0)]
    res = run([
        ("trainer", text, 0, {"versions": [1, 2], "linger_key": "test/done/3"}),
        ("rollout", text, 2, {"wants": wants, "wait_for": [3], "staging": False, "stream": True}),
        ("rollout", text, 3, {"wants": wants, "wait_for": [2], "staging": False, "stream": True}),
    ])
    ntensors = len(W.load_spec(text).rollout.ranks[2].tensors)
    for ev in (res[1].value, res[2].value):
        assert [(e[1], e[2], e[4]) for e in kinds(ev, "applied")] == [(1, 1, []), (2, 2, [])], ev
        states = kinds(ev, "state")
        assert [s[1:5] for s in states] == [(1, False, 1, ntensors), (2, False, 2, ntensors)]
        mem = states[-1][5]
        assert mem["wire_held"] == 0 and mem["staging"] == 0
        shard = sum(t.numel() * t.element_size() for t in empty_like_layout(W.load_spec(text).rollout.ranks[2]).values())
        assert 0 < mem["stream_last"] < shard  # one round's tensors at a time, never the shard
        if transport == "gloo":
            assert 0 < mem["wire_last"] <= 16 << 10
        else:
            assert mem["wire_last"] == 0  # it read the trainer's slab


def test_a_streaming_rank_whose_instance_does_not_apply_what_it_wrote_is_torn_until_the_next_push():
    """Both ranks stream v1 into their engines, but call apply_instance with different versions (2: v1,
    3: v2; their calls meet in one round): the instance applies nothing and both are torn (their engines
    hold v1, their instance does not), with a ProtocolError naming the wants. The trainer's push of v1
    fails at its deadline; v2 reaches both and heals them.

    Before the wants were part of the offers, each rank decided with its own want: rollout 2 applied
    v1 while rollout 3 raised TooLate, an instance split (and rollout 3, its call spent, never received
    v2)."""
    text = W.spec(mode="sync", round_bytes="16KiB", dedup="off", timeout_s=10.0)
    res = run([
        ("trainer", text, 0, {"versions": [1, 2], "linger_key": "test/done/3", "go_on": True}),
        ("rollout", text, 2, {"wants": [(1, 30.0), (2, 30.0)], "after_push": True, "wait_for": [3],
                              "staging": False, "stream": True}),
        ("rollout", text, 3, {"wants": [(2, 30.0), (2, 30.0)], "after_push": True, "wait_for": [2],
                              "staging": False, "stream": True}),
    ], timeout_s=90)
    trainer, r2, r3 = res[0].value, res[1].value, res[2].value
    assert [(e[0], e[1]) for e in trainer if e[0] in ("error", "pushed")] == [("error", 1), ("pushed", 2)], trainer
    for rank, events, want in ((2, r2, 1), (3, r3, 2)):
        (err,) = kinds(events, "error")
        assert err[1:3] == (want, "ProtocolError"), err
        assert "called apply_instance with different versions in one round (rollout 2: 1, rollout 3: 2)" in err[3]
        ntensors = len(W.load_spec(text).rollout.ranks[rank].tensors)
        first, second = kinds(events, "state")
        assert first[1:5] == (want, True, None, ntensors)  # wrote all of v1, torn
        assert second[1:4] == (2, False, 2)  # healed by v2
        assert [(e[1], e[2], e[4]) for e in kinds(events, "applied")] == [(2, 2, [])]
