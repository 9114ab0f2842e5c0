"""The control plane in threads over a HashStore: deadlines, failure fan-out, heartbeats, handshake."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist

from weightbridge.sync.control import ControlPlane
from weightbridge.sync.handshake import check_hellos, handshake
from weightbridge.sync.heartbeat import HeartbeatMonitor
from weightbridge.errors import DeadlineExceeded, DeviceConflict, HandshakeMismatch, PeerFailed
from weightbridge.sync.roster import RankId
from weightbridge.sync.messages import DeviceIdentity, Hello, Keys

T0, T1, R0 = RankId("trainer", 0), RankId("trainer", 1), RankId("rollout", 0)


def cp(store, who, timeout_s=5.0, heartbeat_s=0.05):
    return ControlPlane(store, me=who, keys=Keys("t"), timeout_s=timeout_s, heartbeat_s=heartbeat_s)


def hello(who, plan="p", spec="s", dtypes="d", diffs=(), identity=None):
    return Hello(side=who.side, rank=who.rank, epoch=1, spec_hash=spec, plan_hash=plan, dtypes=dtypes,
                 dtype_diffs=diffs, nonce="n", identity=identity)


def on(backend, device, host="h1", label=None):
    """A stated identity: fake CUDA values (no GPU here); ``label`` defaults to cuda:0 for a GPU."""
    return DeviceIdentity(backend=backend, host=host, device=device,
                          label=label or ("cpu" if device == "cpu" else "cuda:0"))


def test_a_wait_for_a_key_nobody_writes_raises_deadline_exceeded_naming_what_it_waited_for():
    c = cp(dist.HashStore(), T0, timeout_s=0.2)
    t = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"trainer 0: no progress after 0.2s waiting for the answer"):
        c.wait_for(["t/never"], c.deadline(), "the answer")
    assert time.monotonic() - t < 1.0


def test_a_published_failure_reaches_every_waiting_rank_with_the_failing_rank_message():
    store = dist.HashStore()
    waiters = [cp(store, T0), cp(store, R0)]
    failing = cp(store, T1)

    def wait(c):
        with pytest.raises(PeerFailed) as info:
            c.wait_for(["t/never"], c.deadline(), "data", epoch=3)
        return info.value

    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(wait, c) for c in waiters]
        time.sleep(0.05)
        failing.publish_failure(3, ValueError("disk on fire"))
        errs = [f.result(timeout=5) for f in futs]
    for e, who in zip(errs, ("trainer 0", "rollout 0")):
        assert (e.rank, e.peer) == (who, "trainer 1")
        assert "ValueError: disk on fire" in e.message


def test_failures_of_an_earlier_push_are_ignored_with_since():
    store = dist.HashStore()
    cp(store, T1).publish_failure(1, RuntimeError("old"))
    c = cp(store, T0, timeout_s=0.1)
    with pytest.raises(DeadlineExceeded):
        c.wait_for(["t/never"], c.deadline(), "x", epoch=1, since=1)
    with pytest.raises(PeerFailed, match="old"):
        c.wait_for(["t/never"], c.deadline(), "x", epoch=1, since=0)


def test_a_late_failure_of_the_previous_push_does_not_end_a_wait_for_the_next_one():
    """Issue 13 soak: trainer 1 published its failure of push 1 after trainer 0 had begun push 2, and
    trainer 0's wait before announcing 2 took it for a failure of push 2 (so push 2 failed too)."""
    from weightbridge.runtime.trainer import _of_push

    store = dist.HashStore()
    waiter = cp(store, T1, timeout_s=0.3)
    since = waiter.failure_count(1)

    def wait():
        waiter.wait_for([], waiter.deadline(), "trainer 0 to announce version 2", ready=lambda _: False,
                        epoch=1, since=since, only=_of_push(2, T0))

    cp(store, R0).publish_failure(1, RuntimeError("rollout 0 in push 1"), version=1)
    cp(store, T0).publish_failure(1, RuntimeError("trainer 0 in push 1"), version=1)
    cp(store, R0).publish_failure(1, RuntimeError("rollout 0 in push 2"), version=2)
    with pytest.raises(DeadlineExceeded):
        wait()
    cp(store, T0).publish_failure(1, RuntimeError("no rollout instance joined"), version=2)
    with pytest.raises(PeerFailed, match="no rollout instance joined"):
        wait()


def test_a_member_that_joined_again_ends_a_wait_but_a_replayed_older_join_does_not():
    """A restarted rank beats under its predecessor's heartbeat key: only its join record (a later
    ``started``) tells the waiters that the member they wait for is gone."""
    from weightbridge.sync.board import Board

    store = dist.HashStore()
    Board(cp(store, R0)).join(0, "first", started=1000)
    waiter = cp(store, T0, timeout_s=0.3)
    joins = {R0: Board(waiter).join_of(R0)}
    Board(cp(store, R0)).join(0, "second", started=2000)
    with pytest.raises(PeerFailed, match="rollout 0 failed: restarted"):
        waiter.wait_for(["t/never"], waiter.deadline(), "acks", joins=joins)
    Board(cp(store, R0)).join(0, "zeroth", started=500)  # an earlier process's record, replayed
    with pytest.raises(DeadlineExceeded):
        waiter.wait_for(["t/never"], waiter.deadline(), "acks", joins=joins)
    store.set(Keys("t").join(R0.key), b"garbage")
    with pytest.raises(DeadlineExceeded):
        waiter.wait_for(["t/never"], waiter.deadline(), "acks", joins=joins)


def test_peer_failed_is_not_republished():
    store = dist.HashStore()
    c = cp(store, T0)
    c.publish_failure(1, PeerFailed(T0, T1, "x"))
    assert c.failures(1) == []


def test_a_rank_whose_heartbeat_stops_is_reported_dead_while_watched():
    store = dist.HashStore()
    dead = cp(store, T1, heartbeat_s=0.05)
    dead.start_heartbeat()
    time.sleep(0.2)
    dead.stop_heartbeat()  # the process "dies"
    c = ControlPlane(store, me=T0, keys=Keys("t"), timeout_s=10, heartbeat_s=0.05, dead_after_s=0.5)
    t = time.monotonic()
    with pytest.raises(PeerFailed, match=r"peer trainer 1 failed: no heartbeat"):
        c.wait_for(["t/never"], c.deadline(), "x", watch=[T1])
    assert time.monotonic() - t < 3
    assert c.monitor.known_dead(T1, c.counter("t/hb/trainer/1"))


def test_the_heartbeat_thread_outlives_a_store_outage():
    """Issue 27: the heartbeat thread returned on its first store error, silently and for good, so a rank
    whose store was unreachable for a moment looked dead to every peer for the rest of the job."""
    store = dist.HashStore()
    outage = {"left": 3}

    class Flaky(dist.Store):  # a unit helper: the store's connection fails for three writes, then is back
        def set(self, key, value):
            if outage["left"] > 0:
                outage["left"] -= 1
                raise dist.DistNetworkError("Connection reset by peer")
            store.set(key, value)

        def compare_set(self, key, expected, desired):
            return store.compare_set(key, expected, desired)

    beating = cp(Flaky(), T1, heartbeat_s=0.02)
    beating.start_heartbeat()
    reader = cp(store, T0)
    try:
        deadline = time.monotonic() + 5
        while (outage["left"] > 0 or reader.heartbeat(T1) == 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        first = reader.heartbeat(T1)  # the first beat after the outage
        while reader.heartbeat(T1) <= first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0 < first < reader.heartbeat(T1), "the heartbeat stopped at the outage"
    finally:
        beating.stop_heartbeat()


def test_a_live_heartbeat_is_not_reported_and_a_rank_never_seen_is_left_to_the_deadline():
    store = dist.HashStore()
    alive = cp(store, T1, heartbeat_s=0.05)
    alive.start_heartbeat()
    c = ControlPlane(store, me=T0, keys=Keys("t"), timeout_s=0.8, heartbeat_s=0.05, dead_after_s=0.3)
    with pytest.raises(DeadlineExceeded):
        c.wait_for(["t/never"], c.deadline(), "x", watch=[T1, R0])  # R0 never started: deadline
    alive.stop_heartbeat()


def test_heartbeat_monitor_restarts_its_clock_after_a_gap_in_watching():
    m = HeartbeatMonitor(dead_after_s=1.0)
    for now in (0.0, 0.4, 0.8):
        m.observe(T1, 5, now=now)
    assert not m.dead(T1, 0.8)
    m.observe(T1, 5, now=1.2)
    assert m.dead(T1, 1.2)
    m.observe(T1, 5, now=10.0)  # not watched for 8.8s: cannot tell when it stopped
    assert not m.dead(T1, 10.0)


def test_a_plan_hash_mismatch_fails_the_handshake_on_every_rank_naming_both_sides():
    store = dist.HashStore()
    members = [T0, T1, R0]
    plans = {T0: "aaa", T1: "aaa", R0: "bbb"}

    def run(who):
        c = cp(store, who)
        with pytest.raises(HandshakeMismatch) as info:
            handshake(c, hello(who, plan=plans[who]), members, {}, c.deadline())
        return info.value

    with ThreadPoolExecutor(3) as pool:
        errs = dict(zip(members, pool.map(run, members)))
    assert str(errs[T0]) == "trainer 0: handshake mismatch on plan_hash: trainer 0 has aaa, rollout 0 has bbb"
    assert str(errs[T1]) == "trainer 1: handshake mismatch on plan_hash: trainer 1 has aaa, rollout 0 has bbb"
    assert str(errs[R0]) == "rollout 0: handshake mismatch on plan_hash: rollout 0 has bbb, trainer 0 has aaa"


def test_a_dtype_mismatch_names_the_rank_and_its_tensors():
    hellos = {T0: hello(T0, dtypes="x"), R0: hello(R0, dtypes="y", diffs=("qkv: spec bfloat16, tensor float32",))}
    with pytest.raises(HandshakeMismatch) as info:
        check_hellos(T0, hellos, {T0: "x", R0: "z"})
    e = info.value
    assert (e.field, e.peer) == ("dtypes", "rollout 0")
    assert "qkv: spec bfloat16, tensor float32" in str(e)


def test_mismatched_backends_fail_on_every_rank_naming_both_with_their_devices():
    """A CPU-offloaded trainer (Gloo) next to CUDA rollouts (NCCL): before, the two sides waited for
    each other in different backends' rendezvous until a PeerTimeout."""
    hellos = {T0: hello(T0, identity=on("gloo", "cpu")), T1: hello(T1, identity=on("gloo", "cpu")),
              R0: hello(R0, identity=on("nccl", "GPU-1234"))}
    errs = {}
    for me in hellos:
        with pytest.raises(HandshakeMismatch) as info:
            check_hellos(me, hellos, {})
        errs[me] = info.value
    assert str(errs[T0]) == ("trainer 0: handshake mismatch on backend: trainer 0 has gloo on cpu of host h1, rollout 0 "
                             "has nccl on cuda:0 (GPU-1234) of host h1 (every rank of a bridge moves bytes with one "
                             "backend: with a CPU-offloaded side set sync.transport: gloo in the spec, or keep every "
                             "side's tensors on CUDA)")
    assert (errs[T1].field, errs[T1].peer) == ("backend", "rollout 0")
    assert (errs[R0].field, errs[R0].peer, errs[R0].value) == ("backend", "trainer 0", "nccl on cuda:0 (GPU-1234) of host h1")
    # an endpoint that states nothing agrees only with endpoints that state nothing
    with pytest.raises(HandshakeMismatch, match="trainer 0 has no stated backend, rollout 0 has nccl"):
        check_hellos(T0, {T0: hello(T0), R0: hello(R0, identity=on("nccl", "GPU-1"))}, {})
    check_hellos(T0, {T0: hello(T0), R0: hello(R0)}, {})


def test_two_nccl_members_on_one_gpu_are_refused_on_every_rank_naming_both():
    hellos = {T0: hello(T0, identity=on("nccl", "GPU-aaaa")), T1: hello(T1, identity=on("nccl", "GPU-bbbb", host="h2")),
              R0: hello(R0, identity=on("nccl", "GPU-aaaa", label="cuda:3"))}
    for me in hellos:
        with pytest.raises(DeviceConflict) as info:
            check_hellos(me, hellos, {})
        e = info.value
        assert isinstance(e, HandshakeMismatch) and (e.rank, e.first, e.peer, e.field) == (str(me), "trainer 0", "rollout 0",
                                                                                            "device")
        assert str(e) == (f"{me}: handshake refused: trainer 0 and rollout 0 are both on cuda:3 (GPU-aaaa) of host h1, "
                          "and NCCL does not support two members of one communicator on one device (place them on "
                          "different GPUs, or set sync.transport: gloo in the spec)")
    # a GPU UUID names one device on every host (another network namespace of the same machine included)
    hellos[R0] = hello(R0, identity=on("nccl", "GPU-aaaa", host="h9"))
    with pytest.raises(DeviceConflict):
        check_hellos(T0, hellos, {})


def test_devices_that_may_be_shared_pass():
    # Gloo members on one GPU (the bytes go through host memory): fine
    check_hellos(T0, {T0: hello(T0, identity=on("gloo", "GPU-a")), R0: hello(R0, identity=on("gloo", "GPU-a"))}, {})
    # NCCL on distinct GPUs; no UUID known: cuda:0 of two hosts are two devices, of one host one
    check_hellos(T0, {T0: hello(T0, identity=on("nccl", "GPU-a")), R0: hello(R0, identity=on("nccl", "GPU-b"))}, {})
    two_hosts = {T0: hello(T0, identity=on("nccl", "cuda:0", host="h1")), R0: hello(R0, identity=on("nccl", "cuda:0", host="h2"))}
    check_hellos(T0, two_hosts, {})
    one_host = {T0: hello(T0, identity=on("nccl", "cuda:0")), R0: hello(R0, identity=on("nccl", "cuda:0"))}
    with pytest.raises(DeviceConflict, match="trainer 0 and rollout 0 are both on cuda:0 of host h1"):
        check_hellos(R0, one_host, {})


def test_a_store_that_went_away_is_store_unreachable_naming_this_rank_not_a_peer():
    """Issue 27: a store error was relabelled ``PeerFailed(... trainer 0 ... control store unreachable)``,
    wrong under ``sync.store: external`` (trainer 0 hosts nothing there)."""
    import datetime

    from weightbridge.errors import StoreUnreachable
    from weightbridge.transport.store import open_store

    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=5)
    client = dist.TCPStore("127.0.0.1", master.port, None, False, datetime.timedelta(seconds=1))
    c = ControlPlane(client, me=R0, keys=Keys("t"), timeout_s=1)
    del master  # the store's host is gone
    with pytest.raises(StoreUnreachable) as info:
        for _ in range(50):  # the server's sockets close right after the master object is released
            c.wait_for(["k"], c.deadline(0.05), "x")
    assert info.value.rank == "rollout 0" and "trainer 0" not in str(info.value)


def test_a_key_deleted_between_check_and_get_neither_blocks_past_the_deadline_nor_blames_a_peer():
    """Issue 27: ``wait_for`` checked, then got; a key deleted in between blocked in ``get`` until the store's
    own timeout (30 s here), far past the wait's deadline, and then raised ``PeerFailed`` naming trainer 0."""
    import datetime

    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=30))

    class DeletesAfterCheck(dist.Store):  # a stranger deletes every key right after a check found it
        def check(self, keys):
            found = store.check(keys)
            for k in keys:
                store.delete_key(k)
            return found

        def set(self, key, value):
            store.set(key, value)

        def get(self, key):
            return store.get(key)

        def compare_set(self, key, expected, desired):
            return store.compare_set(key, expected, desired)

    c = ControlPlane(DeletesAfterCheck(), me=R0, keys=Keys("t"), timeout_s=0.3)
    c.set_raw("t/k", b"v")
    t = time.monotonic()
    assert c.wait_for(["t/k"], c.deadline(), "x") == [b"v"]  # read in one call: no window to delete it in
    with pytest.raises(DeadlineExceeded):
        c.wait_for(["t/never"], c.deadline(), "y")
    assert time.monotonic() - t < 2.0


def test_a_member_restarting_before_it_greets_is_replaced_by_its_successor_in_the_handshake():
    """The whole trainer side restarts after a failure: trainer 0 opens the epoch while trainer 1's
    join record is still its dead predecessor's. Trainer 1's successor joins (a later process) and
    greets: the handshake completes with it (it used to end trainer 0's wait with "restarted")."""
    from weightbridge.sync.board import Board

    store = dist.HashStore()
    Board(cp(store, T1)).join(0, "dead", started=1000)  # the killed incarnation's record
    t0 = cp(store, T0, timeout_s=3.0)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(handshake, t0, hello(T0), [T0, T1], {}, t0.deadline())
        time.sleep(0.3)  # trainer 0 waits past a heartbeat check with the stale record in place
        successor = cp(store, T1, timeout_s=3.0)
        Board(successor).join(0, "successor", started=2000)
        time.sleep(0.1)
        handshake(successor, hello(T1).model_copy(update={"nonce": "successor", "started": 2000}), [T0, T1], {},
                  successor.deadline())
        hellos = fut.result(timeout=5)
    assert hellos[T1].nonce == "successor"


def test_trainer_0_deletes_the_keys_of_epochs_older_than_the_three_newest_it_opened():
    """Issue 26: stale per-epoch keys stayed on the store for the whole job (members, hellos, failures, the
    bridge group's rendezvous keys of every epoch)."""
    from weightbridge.sync.board import Board
    from weightbridge.sync.roster import Roster

    store = dist.HashStore()
    keys = Keys("t")
    board = Board(ControlPlane(store, me=T0, keys=keys, timeout_s=1, ranks=(T0, T1, R0)))
    roster = Roster(2, (0,), (0,))

    def epoch_keys(e):
        return [keys.members(e), keys.failed(e), keys.hello(e, "trainer/0"), keys.hello(e, "rollout/0"),
                keys.failure(e, "trainer/1"), f"{keys.group_prefix(e)}//0/2"]

    for e in range(1, 6):
        assert board.open_epoch(roster, "test").epoch == e
        for k in epoch_keys(e)[1:]:
            store.set(k, b"x")  # what the members, a failing rank and Gloo write in that epoch
    assert not any(store.check([k]) for e in (1, 2) for k in epoch_keys(e))
    assert all(store.check([k]) for e in (3, 4, 5) for k in epoch_keys(e))
