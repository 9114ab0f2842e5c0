"""Control-store round trips: a push's reads do not grow with the rollout (issue 32).

Every store call is a network round trip; trainer 0 used to read each rollout rank's join record,
heartbeat and acks one after the other (a push took 30-42 sequential round trips with four
instances, ``bench/control_rtt.py``). Reads of a look are now one snapshot (``sync/batch.py``):
``check`` of all keys and one ``multi_get``. Bridges run in threads over a real TCPStore (the
reconnecting client is what batches), bytes through the store (``StoreDataPlane``).
"""

from __future__ import annotations

import threading
import time

import pytest

from weightbridge.bridge import load_spec
from weightbridge.runtime import epochs
from weightbridge.sync import batch as B
from weightbridge.sync.board import Board
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.messages import Keys
from weightbridge.sync.roster import RankId
from weightbridge.transport.store import open_store
from weightbridge.transport.store_client import ReconnectingStore

from sync_harness import Threads, rollout_bridge, spec_text, trainer_bridge


class Counted:
    """Count ``ControlPlane.store_call`` (every store call of the control plane) on one thread."""

    def __init__(self, monkeypatch) -> None:
        self.thread: int | None = None
        self.calls: list[str] = []
        real = ControlPlane.store_call

        def call(cp, fn, *args):
            if threading.get_ident() == self.thread:
                self.calls.append(getattr(fn, "__name__", str(fn)))
            return real(cp, fn, *args)

        monkeypatch.setattr(ControlPlane, "store_call", call)


def pre_announce_calls(monkeypatch, mode: str, instances: int) -> int:
    """Store calls trainer 0 makes in a steady push before it announces (fewest over pushes 2-4)."""
    counted = Counted(monkeypatch)
    marks: list[int] = []
    real_announce = Board.announce

    def announce(board, *args, **kw):
        if threading.get_ident() == counted.thread:
            marks.append(len(counted.calls))
        return real_announce(board, *args, **kw)

    monkeypatch.setattr(Board, "announce", announce)
    monkeypatch.setattr(epochs, "REJOIN_CHECK_S", 1e9)  # no join-record check (every 0.25 s: timing)
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)

    def client():
        return open_store("127.0.0.1", master.port, is_master=False, timeout_s=30)

    r = load_spec(spec_text(mode=mode, timeout_s=20, heartbeat_s=5.0, trainer="{preset: fsdp2, mesh: {dp: 1}}",
                            rollout=f"{{preset: vllm, instances: {instances}, mesh: {{tp: 1}}}}"))
    T = Threads()
    seen: list[int] = []

    def trainer():
        b, _ = trainer_bridge(r, 0, client())
        counted.thread = threading.get_ident()
        try:
            for v in range(1, 5):
                start = len(counted.calls)
                b.push(v)
                seen.append(marks[-1] - start)
        finally:
            b.close()

    def rollout(rank):
        b, _ = rollout_bridge(r, rank, client(), staging=mode == "async")
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                if b.poll() and b.apply() >= 4:
                    break
                time.sleep(0.001)
        finally:
            time.sleep(0.3)
            b.close()

    try:
        for q in range(instances):
            T.start(f"r{q}", rollout, q)
        T.start("t0", trainer)
        T.result("t0", timeout=60)
        for q in range(instances):
            T.result(f"r{q}", timeout=60)
    finally:
        T.close()
    return min(seen[1:])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainer_zero_reads_the_same_store_calls_for_two_or_six_instances(monkeypatch, mode):
    few = pre_announce_calls(monkeypatch, mode, 2)
    many = pre_announce_calls(monkeypatch, mode, 6)
    # before: ~4 calls more per rollout rank (a join check and a heartbeat per rank, async also its
    # join record and applied ack, and every member's join record for the epoch view)
    assert many == few, (few, many)
    assert many <= 5, many  # the failure flag, the look (check + multi_get), the epoch's failure count


def test_read_many_is_one_check_and_one_multi_get_and_never_blocks(monkeypatch):
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)
    store = ReconnectingStore("127.0.0.1", master.port, timeout_s=30, who="test")
    cp = ControlPlane(store, me=RankId("trainer", 0), keys=Keys("t"), timeout_s=30)
    keys = [f"t/k{i}" for i in range(6)]
    for i, k in enumerate(keys):
        cp.set_raw(k, f"v{i}".encode())

    def opened(values):
        return {k: None if v is None else cp.open(k, v) for k, v in values.items()}

    counted = Counted(monkeypatch)
    counted.thread = threading.get_ident()
    assert opened(B.read_many(cp, keys)) == {k: f"v{i}".encode() for i, k in enumerate(keys)}
    assert counted.calls == ["check", "multi_get_within"]
    counted.calls.clear()
    got = opened(B.read_many(cp, [*keys, "t/absent"]))  # one absent: a read each, none blocks
    assert got["t/absent"] is None and got["t/k0"] == b"v0" and counted.calls[0] == "check" and len(counted.calls) == 8
    counted.calls.clear()
    assert B.read_many(cp, [*keys, "t/absent"], all_or_none=True) is None and counted.calls == ["check"]
    counted.calls.clear()
    with B.batch(cp, keys):  # reads inside the block: from the snapshot, no store call
        assert cp.get_raw("t/k3") is not None and cp.exists(keys) and len(counted.calls) == 2
        with pytest.raises(RuntimeError, match="inside a batch"):
            cp.wait_for([], time.monotonic() + 1, "nothing")
    # a key deleted between the check and the read: the multi_get gives up within MULTI_GET_S
    monkeypatch.setattr(B, "MULTI_GET_S", 0.3)
    monkeypatch.setattr(store, "check", lambda ks: True)
    t0 = time.monotonic()
    got = opened(B.read_many(cp, [*keys, "t/gone"]))
    assert got["t/gone"] is None and got["t/k5"] == b"v5" and time.monotonic() - t0 < 2.0
