"""Authentication of the control plane (issue 13): a job secret, sealed values, no counters, typed errors.

In-process (HashStore, threads). The multiprocess hostile-client tests are in test_auth_mp.py.
"""

from __future__ import annotations

import socket
import time

import pytest
import torch.distributed as dist

from weightbridge.bridge import BridgeOptions
from weightbridge.errors import AuthError, BridgeError, ForgedMessage, PeerFailed, ProtocolError
from weightbridge.spec.resolve import load_spec
from weightbridge.sync.auth import ENV, HEADER_BYTES, Signer, signer_for
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.messages import Ack, Keys, encode
from weightbridge.sync.roster import RankId

from sync_harness import Threads, rollout_bridge, spec_text, trainer_bridge

T0, T1, R0 = RankId("trainer", 0), RankId("trainer", 1), RankId("rollout", 0)
GOOD, OTHER = Signer(b"a" * 32, "test"), Signer(b"b" * 32, "test")


class NoAdd:
    """A store without ``add``: the control plane must never count on the store."""

    def __init__(self):
        self.inner = dist.HashStore()
        self.set, self.get, self.check, self.delete_key, self.compare_set = (
            self.inner.set, self.inner.get, self.inner.check, self.inner.delete_key, self.inner.compare_set)

    def add(self, key, n):
        raise AssertionError(f"store.add({key!r}) called")


def cp(store, who, signer=GOOD, timeout_s=0.5):
    return ControlPlane(store, me=who, keys=Keys("wb"), timeout_s=timeout_s, heartbeat_s=0.05, auth=signer,
                        ranks=(T0, T1, R0))


def test_a_sealed_value_opens_only_with_the_same_secret_under_the_same_key():
    v = GOOD.seal("wb/ann", b"{}")
    assert v[HEADER_BYTES:] == b"{}" and GOOD.open("wb/ann", v) == b"{}"
    for signer, key, value in [(OTHER, "wb/ann", v), (GOOD, "wb/ack/staged/0", v), (GOOD, "wb/ann", b"{}"),
                               (GOOD, "wb/ann", b"short")]:
        with pytest.raises(ForgedMessage, match="not authenticated by the job secret"):
            signer.open(key, value, T0)
    with pytest.raises(TypeError):  # never pickled: the secret travels through the environment
        import pickle

        pickle.dumps(GOOD)


def test_from_spec_without_a_secret_raises_auth_error_saying_how_to_provide_one(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    r = load_spec(spec_text())
    with pytest.raises(AuthError) as info:
        trainer_bridge(r, 0, dist.HashStore())
    msg = str(info.value)
    for hint in (ENV, "BridgeOptions(secret=...)", "sync.secret_file", "weightbridge secret"):
        assert hint in msg
    assert isinstance(info.value, BridgeError)


def test_the_secret_comes_from_options_then_env_then_the_spec_file_and_auth_off_needs_none(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "job.secret").write_text("f" * 40 + "\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text(secret_file="job.secret"))
    r = load_spec(str(spec))
    from_file = signer_for(r)
    sealed = from_file.seal("k", b"x")
    assert "secret_file" in from_file.source and Signer(b"f" * 40).open("k", sealed) == b"x"
    monkeypatch.setenv(ENV, "e" * 40)
    assert signer_for(r).source == f"${ENV}"
    assert signer_for(r, "o" * 40).source == "BridgeOptions(secret=...)"
    with pytest.raises(AuthError, match="at least 16"):
        signer_for(r, "short")
    assert not signer_for(load_spec(spec_text(auth="off"))).enabled
    assert "o" * 20 not in repr(BridgeOptions(secret="o" * 40))


def test_garbage_or_another_secret_under_a_key_gives_forged_message_naming_the_key():
    store = dist.HashStore()
    c = cp(store, T0)
    store.set("wb/ann", b'{"kind":"announce","seq":999,"version":999,"epoch":1}')
    with pytest.raises(ForgedMessage, match="'wb/ann'"):
        c.wait_for(["wb/ann"], c.deadline(), "the announcement")
    cp(store, T1, signer=OTHER).set("wb/ann", Ack(rank=0, version=1, seq=1, epoch=1, stage="staged"))
    with pytest.raises(ForgedMessage):
        c.get("wb/ann", Ack)
    # a genuine value of the wrong kind is a typed ProtocolError, never a TypeError / ValidationError
    from weightbridge.sync.messages import Announce

    c.set("wb/ann", Ack(rank=0, version=1, seq=1, epoch=1, stage="staged"))
    with pytest.raises(ProtocolError, match="not a valid Announce"):
        c.get("wb/ann", Announce)


def test_failures_need_no_counter_and_a_forged_failure_or_flag_is_ignored():
    store = NoAdd()  # the control plane never calls store.add (a non-integer there kills TCPStore clients)
    a, b = cp(store, T0), cp(store, T1)
    b.publish_failure(3, ValueError("disk on fire"))
    assert a.failure_count(3) == 1
    with pytest.raises(PeerFailed, match="disk on fire"):
        a.raise_failures(3)
    a.raise_failures(3, since=1)  # seen before: ignored
    b.publish_failure(3, ValueError("again"))  # the same rank fails again in the same epoch: a new failure
    with pytest.raises(PeerFailed, match="again"):
        a.raise_failures(3, since=1)
    # A forgery under a failure key or the flag is no failure, and no error either: raising it made
    # every later push of a rank still watching that epoch fail (issue 13 hostile run: a jam).
    store.set("wb/e4/fail/trainer/1", b"garbage")
    store.set("wb/e4/failed", GOOD.seal("wb/e4/failed", b"trainer/1 x"))
    a.raise_failures(4)
    store.set("wb/e4/failed", OTHER.seal("wb/e4/failed", b"trainer/1 y"))
    a.raise_failures(4)
    assert a.failure_count(4) == 0
    b.publish_failure(4, ValueError("real"))  # the genuine failure after them is seen
    with pytest.raises(PeerFailed, match="real"):
        a.raise_failures(4)


def test_a_forged_heartbeat_neither_fakes_life_nor_death_and_the_epoch_never_goes_backwards():
    from weightbridge.sync.board import Board
    from weightbridge.sync.roster import Roster

    store = NoAdd()
    a = cp(store, T0)
    b = cp(store, T1)
    b.start_heartbeat()
    time.sleep(0.2)
    a.check_heartbeats([T1])
    real = a.monitor.last_counter(T1)
    b.stop_heartbeat()
    store.set("wb/hb/trainer/1", b"not an integer")
    a.check_heartbeats([T1])  # no error: a forged value is no reading at all
    assert a.heartbeat(T1) is None and a.monitor.last_counter(T1) == real > 0
    board = Board(a)
    roster = Roster(2, (0,), (0,), 0)
    e1 = board.open_epoch(roster, "first").epoch
    replay = store.get("wb/epoch")
    e2 = board.open_epoch(roster, "second").epoch
    store.set("wb/epoch", replay)  # a replayed genuine old value
    e3 = board.open_epoch(roster, "third").epoch
    store.set("wb/epoch", b"garbage")  # a non-integer under the former counter key
    e4 = Board(cp(store, T0)).open_epoch(roster, "restarted trainer 0").epoch  # no memory: skips used epochs
    assert [e1, e2, e3, e4] == [1, 2, 3, 4]


def test_replayed_acks_of_another_epoch_or_incarnation_do_not_count():
    from weightbridge.sync.board import Board
    from weightbridge.sync.messages import Announce, Hello

    store = dist.HashStore()
    rb = Board(cp(store, R0))
    rb.nonce = "old-process"
    rb.ack("staged", Announce(seq=5, version=5, epoch=2))
    tb = Board(cp(store, T0))
    hello = Hello(side="rollout", rank=0, epoch=3, spec_hash="s", plan_hash="p", dtypes="d", nonce="new-process")
    assert tb.acks("staged", [0]) != {}
    assert tb.acks("staged", [0], epoch=3, hellos={R0: hello}) == {}  # old epoch
    assert tb.acks("staged", [0], epoch=2, hellos={R0: hello}) == {}  # old incarnation
    rb.nonce = "new-process"
    rb.ack("staged", Announce(seq=6, version=6, epoch=3))
    assert tb.acks("staged", [0], epoch=3, hellos={R0: hello})[0].seq == 6


def test_forged_acks_written_raw_do_not_make_a_push_return_early():
    """Threads: the trainers push while the only rollout rank never receives; forged acks are on the store."""
    r = load_spec(spec_text(rollout="{preset: vllm, instances: 1, mesh: {tp: 1}}", timeout_s=2.0))
    T = Threads()
    try:
        for v in range(1, 50):  # unsigned acks claiming every version
            for stage in ("staged", "applied"):
                T.store.set(f"wb/ack/{stage}/0", encode(Ack(rank=0, version=v, seq=v, epoch=1, stage=stage)))
        rb, _ = rollout_bridge(r, 0, T.store, staging=True)

        def push(rank):
            b, _ = trainer_bridge(r, rank, T.store)
            try:
                return b.push(1)
            finally:
                b.close()

        T.start("t0", push, 0)
        T.start("t1", push, 1)
        for name in ("t0", "t1"):
            err = T.exception(name, timeout=30)
            assert err is not None, "a push returned although no rollout acked"
            assert isinstance(err, BridgeError), repr(err)
        rb.close()
    finally:
        T.close()


def test_the_store_listens_on_loopback_only_by_default():
    from weightbridge.transport.store import open_store

    addrs = []
    try:
        addrs = [i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing interface's address
            addrs.append(s.getsockname()[0])
    except OSError:
        pass
    external = [a for a in addrs if not a.startswith("127.")]
    if not external:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=5)
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex((external[0], store.port)) != 0, f"the store answered on {external[0]}"
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", store.port)) == 0
