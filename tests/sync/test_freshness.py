"""Freshness against a stranger's writes (issue 26, item 4): garbage or replayed heartbeats never make a live
rank look dead, and a genuine old announcement rewritten every 5 ms never hides the real ones.

Client side (any store): an unreadable or older heartbeat is no reading. Store side (the bounded store
keyed by the job secret, as trainer rank 0 hosts it): a job value is replaced only by a later sealed one.
"""

from __future__ import annotations

import threading
import time

import pytest

from weightbridge.errors import DeadlineExceeded
from weightbridge.sync.auth import signer_from_env
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.heartbeat import HeartbeatMonitor
from weightbridge.sync.messages import Keys
from weightbridge.sync.roster import RankId
from weightbridge.transport.store import open_store

from sync_harness import Engine, one_to_one, push, trainer_bridge

T0, T1 = RankId("trainer", 0), RankId("trainer", 1)
HOST = "127.0.0.1"


def test_only_fresh_readings_move_the_heartbeat_clock():
    m = HeartbeatMonitor(dead_after_s=1.0)
    m.observe(T1, 100, now=0.0)
    for now in (0.3, 0.6, 0.9, 1.2, 1.5):
        m.observe(T1, None, now)  # unreadable: garbage or forged
        m.observe(T1, 42, now)  # a replayed older beat
    assert not m.dead(T1, 1.5) and m.last_counter(T1) == 100  # nothing was read standing still
    m.observe(T1, 101, now=1.6)
    for now in (1.9, 2.2, 2.5, 2.8):
        m.observe(T1, 101, now)  # read standing still for 1.2 s: dead
    assert m.dead(T1, 2.8)


class Stranger:
    """Writes under ``key`` as fast as it can until stopped: garbage, then ``old`` (a genuine value read
    earlier, replayed)."""

    def __init__(self, store, key: str, old: bytes) -> None:
        self.store, self.key, self.old = store, key, old
        self.writes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for value in (b"garbage", self.old):
                self.store.set(self.key, value)
                self.writes += 1
            time.sleep(0.0005)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def hosted_store():
    """The bounded store as trainer rank 0 hosts it (keyed by the job secret) and a client factory."""
    master = open_store(HOST, 0, is_master=True, timeout_s=10)
    return master, lambda: open_store(HOST, master.port, is_master=False, timeout_s=10)


@pytest.mark.parametrize("store_kind,replayed", [("hash", "older"), ("bounded", "older"), ("bounded", "last-read")])
def test_garbage_and_replayed_heartbeats_never_make_a_live_rank_look_dead(store_kind, replayed):
    """Issue 26: garbage or replayed heartbeats made live ranks look dead ("no heartbeat for 5.2s").
    A wait watching a live rank whose heartbeat key a stranger floods (garbage, and a genuine beat) ends
    at its deadline, not with PeerFailed. A beat older than the reader's last is no reading (any store);
    replaying the very beat the reader read last hides the rank's later ones unless the store refuses
    it (a job value is replaced only by a later sealed one), so that case runs against the bounded store."""
    import torch.distributed as dist

    if store_kind == "hash":
        store = dist.HashStore()
        connect = lambda: store  # noqa: E731
    else:
        master, connect = hosted_store()
    keys = Keys("t")
    key = keys.heartbeat(T1.key)
    signer = signer_from_env()
    beating = ControlPlane(connect(), me=T1, keys=keys, timeout_s=5, heartbeat_s=0.05, auth=signer)
    beating.start_heartbeat()
    waiter = ControlPlane(connect(), me=T0, keys=keys, timeout_s=5, heartbeat_s=0.05, dead_after_s=0.5, auth=signer)
    reader = connect()
    time.sleep(0.2)
    for _ in range(50):  # a beat the waiter read: the one replayed, or an older one
        old = reader.get(key)
        if replayed == "older":
            time.sleep(0.2)
        waiter.check_heartbeats([T1])
        if replayed == "older" or waiter.monitor.last_counter(T1) == int(signer.open(key, old)):
            break
    stranger = Stranger(connect(), key, old)
    try:
        t = time.monotonic()
        with pytest.raises(DeadlineExceeded):  # before: PeerFailed ... no heartbeat for 0.5s
            waiter.wait_for(["t/never"], time.monotonic() + 2.0, "nothing", watch=[T1])
        assert time.monotonic() - t > 1.9 and stranger.writes > 100
    finally:
        stranger.close()
        beating.stop_heartbeat()


def test_a_genuine_old_announcement_rewritten_every_ms_hides_no_push():
    """Issue 26: a genuine old announcement written back every 5 ms hid the real ones, so every push failed
    while it ran (here: every millisecond). The store keyed by the secret keeps the newer announcement; trainer 0 also puts its
    announcement back while it waits for acks (a store without the secret, or a deleted key)."""
    r = one_to_one("sync", timeout_s=4.0)
    master, connect = hosted_store()
    engine = Engine(r, connect(), staging=True)
    trainer, tensors = trainer_bridge(r, 0, connect())
    stranger = None
    try:
        assert push(trainer, r, tensors, 1).version == 1
        key = Keys("wb").announce
        old = connect().get(key)
        replay, stop = connect(), threading.Event()

        def rewrite() -> None:
            while not stop.is_set():
                replay.set(key, old)
                time.sleep(0.001)

        stranger = threading.Thread(target=rewrite, daemon=True)
        stranger.start()
        for v in (2, 3, 4):
            assert push(trainer, r, tensors, v).version == v
        deadline = time.monotonic() + 10
        while engine.bridge.version != 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        if stranger is not None:
            stop.set()
            stranger.join(5)
        engine.close()
        trainer.close()
    assert [v for v, _ in engine.applied] == [1, 2, 3, 4] and all(bad == [] for _, bad in engine.applied)
    assert engine.errors == []
    master.server.poll()  # the store lived through the test
