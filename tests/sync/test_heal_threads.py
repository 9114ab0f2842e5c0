"""Issue 13: the bridge heals, and survivors raise in time naming the cause (threads over a HashStore).

* async that heals: after a push that timed out on the staleness bound (a slow ``apply``), a
  failed push, or a restarted rollout, the next push succeeds; staleness counts versions actually
  delivered to each receiver's current process, never version numbers;
* robust readers: garbage, another message kind or a 5 MB value under the announcement key is a
  typed error at the rank's next ``poll()`` and later genuine pushes still arrive; a seq of 10**12
  does not hide the real announcements; a deleted join key is put back by its rank;
* trainer ranks > 0 raise within ``timeout_s`` + slack when trainer 0 fails before announcing.

Bytes move through the store (``sync_fakes.StoreDataPlane``); ``test_heal_mp.py`` runs the
reproducer and the checksum case over Gloo in processes.
"""

from __future__ import annotations

import time

import pytest

from weightbridge.bridge import load_spec
from weightbridge.errors import BadMessage, BridgeError, DeadlineExceeded, PeerFailed
from weightbridge.sync.messages import Announce, Join, Keys

from sync_harness import ONE_ROLLOUT, Engine, Threads, one_to_one, push, rollout_bridge, spec_text, trainer_bridge, wait_until

KEYS = Keys("wb")  # the bridges' default key prefix

SLACK_S = 2.0


# -- async that heals ----------------------------------------------------------------------------
@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_reproducer_one_apply_slower_than_timeout_then_the_next_pushes_succeed(staging):
    """The issue's deterministic reproducer: 1 trainer + 1 rollout, async, one apply > timeout_s."""
    r = one_to_one("async", timeout_s=1.0)
    T = Threads()
    engine = Engine(r, T.store, staging=staging, slow_apply={1: 1.6})
    trainer, tensors = trainer_bridge(r, 0, T.store)
    try:
        assert push(trainer, r, tensors, 1).version == 1
        with pytest.raises(DeadlineExceeded, match="max_staleness 1"):
            push(trainer, r, tensors, 2)  # version 1 not applied in time: push 2 is never announced
        wait_until(lambda: engine.bridge.version == 1, what="the slow apply of version 1")
        for v in (3, 4, 5):  # before the fix: every one waited for version 2, which nobody could apply
            assert push(trainer, r, tensors, v).version == v
        wait_until(lambda: engine.bridge.version == 5, what="version 5 applied")
    finally:
        engine.close()
        trainer.close()
        T.close()
    assert [v for v, _ in engine.applied] == [1, 3, 4, 5]
    assert all(bad == [] for _, bad in engine.applied)


class FailOnce:
    """An ``on_round`` hook that raises in the receive of ``version`` (a rollout-side failure)."""

    def __init__(self, bridge_ref: list, version: int) -> None:
        self.ref, self.version, self.fired = bridge_ref, version, False

    def __call__(self, index: int) -> None:
        ann = self.ref[0].board.announcement() if self.ref else None
        if not self.fired and ann is not None and ann.version == self.version:
            self.fired = True
            raise RuntimeError(f"injected receive failure in version {self.version}")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_a_failed_push_then_the_next_push_succeeds(mode, staging):
    from weightbridge.bridge import BridgeOptions
    from sync_fakes import StoreDataPlane

    r = one_to_one(mode, timeout_s=2.0)
    T = Threads()
    ref: list = []
    opts = BridgeOptions(data_plane=StoreDataPlane("rollout 0"), on_round=FailOnce(ref, 2))
    engine = Engine(r, T.store, staging=staging, options=opts)
    ref.append(engine.bridge)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    try:
        push(trainer, r, tensors, 1)
        wait_until(lambda: engine.bridge.version == 1, what="version 1 applied")
        with pytest.raises(PeerFailed, match="injected receive failure in version 2"):
            push(trainer, r, tensors, 2)
        for v in (3, 4):  # async before the fix: waited for version 2, lost with the failed receive
            s = push(trainer, r, tensors, v)
            assert s.version == v
        wait_until(lambda: engine.bridge.version == 4, what="version 4 applied")
    finally:
        engine.close()
        trainer.close()
        T.close()
    assert [v for v, _ in engine.applied] == [1, 3, 4] and all(bad == [] for _, bad in engine.applied)
    assert any("injected receive failure" in str(e) for e in engine.errors)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_a_restarted_rollout_then_the_next_push_succeeds_and_old_acks_are_ignored(mode, staging):
    r = one_to_one(mode, timeout_s=2.0)
    T = Threads()
    first = Engine(r, T.store, staging=staging, slow_apply={2: 3600.0})  # never applies version 2
    trainer, tensors = trainer_bridge(r, 0, T.store)
    second = None
    try:
        push(trainer, r, tensors, 1)
        wait_until(lambda: first.bridge.version == 1, what="version 1 applied")
        if mode == "async":
            push(trainer, r, tensors, 2)  # staged by the first process, never applied: it dies
            wait_until(lambda: first.bridge.ready(), what="version 2 staged")
        first.kill()
        second = Engine(r, T.store, staging=staging)  # the restart: a new join nonce
        for v in (3, 4):  # async before the fix: waited for the dead process' staged version 2
            assert push(trainer, r, tensors, v).version == v
        wait_until(lambda: second.bridge.version == 4, what="version 4 applied by the new process")
    finally:
        if second is not None:
            second.close()
        trainer.close()
        T.close()
    assert [v for v, _ in second.applied][-1] == 4 and all(bad == [] for _, bad in second.applied)


# -- robust readers ------------------------------------------------------------------------------
def _bad_values(cp, key):
    yield "garbage", lambda: cp.store.set(key, b"\x80\x04K\x01.")  # not even authenticated
    yield "another kind", lambda: cp.set(key, Join(side="rollout", rank=0, instance=0, nonce="x", pid=1, host="h"))
    yield "5 MB", lambda: cp.set_raw(key, b" " * (5 << 20))
    yield "seq 10**12", lambda: cp.set(key, Announce(seq=10**12, version=999, epoch=10**6))


@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_bad_announcement_values_are_typed_errors_at_poll_and_later_pushes_arrive(staging):
    r = one_to_one("sync", timeout_s=1.0)
    T = Threads()
    engine = Engine(r, T.store, staging=staging)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    key = KEYS.announce
    try:
        push(trainer, r, tensors, 1)
        v = 1
        for name, write in _bad_values(trainer.cp, key):
            before = len(engine.errors)
            write()
            # a typed error at the rank's next poll(), once (seq 10**12: its epoch never comes)
            wait_until(lambda: len(engine.errors) > before, what=f"the error for {name}")
            time.sleep(0.1)
            assert all(isinstance(e, BridgeError) for e in engine.errors), engine.errors  # typed, never a thread death
            if name != "seq 10**12":
                assert isinstance(engine.errors[before], BadMessage) and "rollout 0" in str(engine.errors[before])
                assert len(engine.errors) == before + 1, engine.errors[before:]  # reported once
            v += 1
            assert push(trainer, r, tensors, v).version == v  # the receive thread / poll still serve
            wait_until(lambda: engine.bridge.version == v, what=f"version {v} after {name}")
    finally:
        engine.close()
        trainer.close()
        T.close()
    assert [x for x, _ in engine.applied] == list(range(1, v + 1))
    assert all(bad == [] for _, bad in engine.applied)


@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_a_replayed_old_announcement_is_ignored(staging):
    """Issue 13 hostile run (every kind under every key): a genuine old announcement written back made
    a rollout rank receive the push in flight as that old version (bytes of v20 served as v1); an
    announcement older than the last one handled is no push."""
    r = one_to_one("sync", timeout_s=1.0)
    T = Threads()
    engine = Engine(r, T.store, staging=staging)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    key = KEYS.announce
    try:
        push(trainer, r, tensors, 1)
        old = T.store.get(key)
        push(trainer, r, tensors, 2)
        wait_until(lambda: engine.bridge.version == 2, what="version 2 applied")
        T.store.set(key, old)  # the replay: sealed with the secret, but push 1's
        time.sleep(1.5)  # before: the rank received "version 1" again (a rollback, or torn when it failed)
        assert engine.errors == [] and not engine.bridge.torn and engine.bridge.version == 2, engine.errors
        assert push(trainer, r, tensors, 3).version == 3
        wait_until(lambda: engine.bridge.version == 3, what="version 3 applied")
    finally:
        engine.close()
        trainer.close()
        T.close()
    assert [v for v, _ in engine.applied] == [1, 2, 3] and all(bad == [] for _, bad in engine.applied)


def test_garbage_planted_under_an_epochs_hello_keys_does_not_fail_its_handshake():
    """Issue 13 hostile run (every kind under every key): garbage written under hello keys of an epoch
    before it began failed that epoch's push (ForgedMessage); each member overwrites its own key."""
    r = one_to_one("sync", timeout_s=2.0)
    T = Threads()
    engine = Engine(r, T.store, staging=True)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    try:
        for who in ("trainer/0", "rollout/0"):
            T.store.set(KEYS.hello(1, who), b"planted garbage")  # epoch 1: the first push's
        assert push(trainer, r, tensors, 1).version == 1 and trainer.epoch == 1
        wait_until(lambda: engine.bridge.version == 1, what="version 1 applied")
    finally:
        engine.close()
        trainer.close()
        T.close()
    assert engine.errors == [] and engine.applied[-1][0] == 1 and not engine.applied[-1][1]


@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_a_deleted_join_key_is_put_back_and_the_next_push_succeeds(staging):
    r = one_to_one("sync", timeout_s=2.0)
    T = Threads()
    engine = Engine(r, T.store, staging=staging)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    try:
        push(trainer, r, tensors, 1)
        for v in (2, 3):
            T.store.delete_key(KEYS.join("rollout/0"))
            assert push(trainer, r, tensors, v).version == v  # before: waited for the rank to join, forever
        wait_until(lambda: engine.bridge.version == 3, what="version 3 applied")
    finally:
        engine.close()
        trainer.close()
        T.close()


def test_a_rollout_restarted_mid_push_ends_the_trainers_wait_at_once_and_the_next_push_heals():
    """The restarted rank's heartbeat (same key, a moving counter) hid its predecessor's death, so the
    trainer waited for the dead process's ack until its deadline; its new join record ends the wait."""
    timeout_s = 10.0
    r = one_to_one("sync", timeout_s=timeout_s)
    T = Threads()
    engine = Engine(r, T.store, staging=False)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    restarted = None
    try:
        push(trainer, r, tensors, 1)
        wait_until(lambda: engine.bridge.version == 1, what="version 1 applied")
        engine.kill()  # dies serving version 1; its join record stays
        T.start("t", push, trainer, r, tensors, 2)
        time.sleep(0.5)
        t0 = time.monotonic()
        restarted = Engine(r, T.store, staging=False)  # the same rank, a new process
        err = T.exception("t", timeout=30)
        elapsed = time.monotonic() - t0
        assert isinstance(err, PeerFailed) and "rollout 0 failed: restarted" in str(err), err
        assert elapsed < SLACK_S, elapsed  # before: DeadlineExceeded at timeout_s
        assert push(trainer, r, tensors, 3).version == 3
        wait_until(lambda: restarted.applied and restarted.applied[-1][0] == 3, what="version 3 applied again")
        assert not restarted.applied[-1][1], restarted.applied  # bitwise
    finally:
        if restarted is not None:
            restarted.close()
        trainer.close()
        T.close()


# -- every survivor raises in time ---------------------------------------------------------------
def test_trainer_ranks_above_0_raise_in_time_when_trainer_0_fails_before_announcing_with_a_peer_failed():
    """Trainer 0's PeerFailed (a dead receiver, in the staleness wait) is relayed to trainer 1."""
    timeout_s = 5.0  # a dead rank is declared after 3 s: trainer 0 raises PeerFailed before its deadline
    r = load_spec(spec_text(mode="async", timeout_s=timeout_s, rollout=ONE_ROLLOUT))
    T = Threads()
    engine = Engine(r, T.store, staging=True, slow_apply={1: 3600.0})  # stages 1, never applies it
    trainers = [trainer_bridge(r, t, T.store) for t in range(2)]
    try:
        for t, (b, tensors) in enumerate(trainers):
            T.start(f"t{t}", push, b, r, tensors, 1)
        [T.result(f"t{t}") for t in range(2)]
        wait_until(lambda: engine.bridge.ready(), what="version 1 staged")
        engine.kill()
        t0 = time.monotonic()
        for t, (b, tensors) in enumerate(trainers):
            T.start(f"t{t}", push, b, r, tensors, 2)
        e0, e1 = T.exception("t0", timeout=30), T.exception("t1", timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        for b, _ in trainers:
            b.close()
        T.close()
    assert isinstance(e0, PeerFailed) and "rollout 0" in str(e0) and "no heartbeat" in str(e0), e0
    assert isinstance(e1, PeerFailed) and "trainer 0" in str(e1) and "rollout 0" in str(e1), e1
    assert elapsed < timeout_s + SLACK_S, elapsed  # before: 2 x timeout_s


def test_trainer_ranks_above_0_watch_the_epoch_whose_handshake_failed():
    """After a failed handshake trainer 1 must watch that epoch, where trainer 0 publishes next."""
    timeout_s = 3.0
    r = load_spec(spec_text(mode="sync", timeout_s=timeout_s, rollout=ONE_ROLLOUT))
    T = Threads()
    silent, _ = rollout_bridge(r, 0, T.store, staging=False)  # joined, never polls: no hello
    trainers = [trainer_bridge(r, t, T.store) for t in range(2)]
    try:
        for t, (b, tensors) in enumerate(trainers):
            T.start(f"t{t}", push, b, r, tensors, 1)
        for t in range(2):
            assert isinstance(T.exception(f"t{t}", timeout=30), (DeadlineExceeded, PeerFailed))
        silent.close()  # gone: push 2 finds no instance and trainer 0 fails before announcing
        t0 = time.monotonic()
        for t, (b, tensors) in enumerate(trainers):
            T.start(f"t{t}", push, b, r, tensors, 2)
        e0, e1 = T.exception("t0", timeout=30), T.exception("t1", timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        for b, _ in trainers:
            b.close()
        T.close()
    assert isinstance(e0, DeadlineExceeded) and "rollout instance" in str(e0), e0
    assert isinstance(e1, PeerFailed) and "trainer 0" in str(e1) and "DeadlineExceeded" in str(e1), e1
    assert elapsed < timeout_s + SLACK_S, elapsed  # before: 2 x timeout_s


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bad_values_under_the_ack_keys_read_as_no_ack_and_the_next_push_succeeds(mode):
    r = one_to_one(mode, timeout_s=2.0)
    T = Threads()
    engine = Engine(r, T.store, staging=True)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    keys = [KEYS.ack("staged", 0), KEYS.ack("applied", 0)]
    try:
        push(trainer, r, tensors, 1)
        wait_until(lambda: engine.bridge.version == 1, what="version 1 applied")
        for v in (2, 3):
            for k in keys:
                T.store.set(k, b"garbage")
            assert push(trainer, r, tensors, v).version == v
            wait_until(lambda: engine.bridge.version == v, what=f"version {v} applied")
    finally:
        engine.close()
        trainer.close()
        T.close()


def test_a_replayed_older_applied_ack_is_replaced_and_the_next_async_push_succeeds():
    """Issue 13 hostile run: a genuine old applied ack written back under the key held trainer 0's
    staleness wait (the receiver seemed to lag) until the deadline, push after push."""
    r = one_to_one("async", timeout_s=2.0)
    T = Threads()
    engine = Engine(r, T.store, staging=True)
    trainer, tensors = trainer_bridge(r, 0, T.store)
    key = KEYS.ack("applied", 0)
    try:
        push(trainer, r, tensors, 1)
        wait_until(lambda: engine.bridge.version == 1, what="version 1 applied")
        old = T.store.get(key)
        push(trainer, r, tensors, 2)
        wait_until(lambda: engine.bridge.version == 2, what="version 2 applied")
        T.store.set(key, old)  # the replay: sealed, genuine, but version 1's
        for v in (3, 4):
            assert push(trainer, r, tensors, v).version == v
            wait_until(lambda: engine.bridge.version == v, what=f"version {v} applied")
    finally:
        engine.close()
        trainer.close()
        T.close()
