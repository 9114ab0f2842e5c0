"""No single point of failure: the control store in its own process (``weightbridge store``, spec
``sync.store: external``), every rank connecting to it, trainer 0 included.

* trainer 0 SIGKILLed mid-push and restarted: the rollouts and trainer 1 heal, the next push is
  bitwise everywhere;
* the store process SIGKILLed and restarted on the same port (it comes back empty): every rank's
  next store call raises the typed ``StoreUnreachable`` within ``timeout_s`` + slack (``restarted``
  when it was back in time), the ranks rebuild their bridges with ``from_spec`` (the rollouts keep
  serving the version they hold, intact) and the next push is bitwise everywhere.
"""

from __future__ import annotations

import threading
import time

import pytest

import sync_store_workers as W
from sync_harness import spec_text
from weightbridge.localrun import launch
from weightbridge.testing._internal.store_process import StoreProcess
from weightbridge.transport.store import open_store

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT_S = 8.0
SLACK_S = 3.0
SECRET = "external-store-test-secret-0123456789"


def _spec() -> str:
    return spec_text(mode="sync", timeout_s=TIMEOUT_S, heartbeat_s=0.2, store="external")


def _events(res, kind):
    assert res.ok, (res.error, res.traceback, res.timed_out, res.exitcode)
    return [e for e in res.value if e[0] == kind]


@pytest.fixture
def stores(tmp_path):
    proc = StoreProcess(tmp_path)
    proc.start()
    test = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    try:
        yield proc, test
    finally:
        proc.stop()


def test_trainer0_killed_and_restarted_heals_with_an_external_store(stores):
    proc, test = stores
    text = _spec()
    opts = {"secret": SECRET}
    procs = [
        ("trainer", text, 0, {**opts, "versions": [1, 2], "kill": (2, 1)}),  # SIGKILL after round 1 of v2
        # the restarted trainer 0 (it pushes v3 once trainer 1 is done with v2, as a training step would)
        ("trainer", text, 0, {**opts, "versions": [3], "after_kill": True, "wait": {3: "test/pushed/1/2"}}),
        ("trainer", text, 1, {**opts, "versions": [1, 2, 3]}),
    ]
    procs += [("rollout", text, r, {**opts, "last": 3, "staging": r < 2}) for r in range(4)]
    res = launch(W.main, [(role, t, rank, proc.port, test.port, o) for role, t, rank, o in procs], timeout_s=150)
    assert res[0].exitcode == -9 and test.check(["test/killed_at"])
    killed = float(test.get("test/killed_at"))
    assert [e[1] for e in _events(res[1], "pushed")] == [3]  # the restarted trainer 0
    t1 = res[2].value
    assert [e[:2] for e in t1 if e[0] == "pushed"] == [("pushed", 1), ("pushed", 3)], t1
    [err] = [e for e in t1 if e[0] != "pushed"]
    assert err[1] == 2 and err[-1] - killed < TIMEOUT_S + SLACK_S, err  # typed, within the deadline
    for r in range(4):
        applied = _events(res[3 + r], "applied")
        assert applied[-1][1] == 3 and all(e[2] == [] for e in applied), applied  # bitwise, never wrong


def test_the_store_killed_and_restarted_gives_typed_errors_then_heals_after_rebuild(stores):
    proc, test = stores
    text = _spec()
    opts = {"secret": SECRET}
    procs = [("trainer", text, t, {**opts, "versions": [1, 2], "wait": {2: "test/store-restarted"}}) for t in range(2)]
    procs += [("rollout", text, r, {**opts, "last": 2, "staging": r % 2 == 0}) for r in range(4)]
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault(
        "res", launch(W.main, [(role, t, rank, proc.port, test.port, o) for role, t, rank, o in procs], timeout_s=150)))
    runner.start()
    deadline = time.monotonic() + 90
    while not all(test.check([f"test/applied/{r}/1"]) for r in range(4)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline, "version 1 was never applied everywhere"
    killed = time.time()
    proc.kill()
    proc.start()  # the same port; every key is gone
    test.set("test/store-restarted", str(time.time()))
    runner.join(160)
    res = out["res"]
    for t in range(2):
        ev = res[t].value
        assert [e[:2] for e in ev if e[0] == "pushed"] == [("pushed", 1), ("pushed", 2)], ev
        errs = [e for e in ev if e[0] != "pushed"]
        assert errs and all(e[0] == "store-error" for e in errs), errs  # typed StoreUnreachable only
        assert errs[0][5] - killed < TIMEOUT_S + SLACK_S + 10  # the restart itself takes seconds
    for r in range(4):
        ev = res[2 + r].value
        errs = [e for e in ev if e[0] not in ("applied", "final")]
        assert errs and errs[0][0] == "store-error", ev
        _, _restarted, _msg, when, served, keep = errs[0]
        assert when - killed < TIMEOUT_S + SLACK_S and (served, keep) == (1, []), errs[0]  # still serving v1, intact
        applied = _events(res[2 + r], "applied")
        assert [e[1] for e in applied] == [1, 2] and all(e[2] == [] for e in applied), applied


def test_with_default_settings_every_damaged_push_is_detected_and_never_served():
    """Issue 13 item 6: checksums are on by default; a byte flipped in flight (after the sender's checksum)
    raises ChecksumError on the receiver, and no rollout ever applies a damaged version."""
    test = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)  # the external store is the test's own
    text = spec_text(mode="sync", timeout_s=TIMEOUT_S, heartbeat_s=0.2, store="external", transport="gloo")  # the wire (wire_tamper flips Gloo sends)
    assert "checksums" not in text  # the default
    damaged = [2, 3, 4, 5, 6]
    # After a failed push the trainers wait until every rollout rank saw the failure before pushing again:
    # how fast survivors leave a failed epoch is issue 13 item 5, not what this test measures.
    opts = {"secret": SECRET, "await_errors": 4}
    procs = [("trainer", text, 0, {**opts, "versions": [1, *damaged, 7], "damage": damaged})]
    procs += [("trainer", text, 1, {**opts, "versions": [1, *damaged, 7]})]
    procs += [("rollout", text, r, {**opts, "last": 7, "staging": r % 2 == 0}) for r in range(4)]
    res = launch(W.main, [(role, t, rank, test.port, test.port, o) for role, t, rank, o in procs], timeout_s=150)
    for t in range(2):
        ev = res[t].value
        assert [e[1] for e in ev if e[0] == "pushed"] == [1, 7], ev  # every damaged push failed, typed
        assert [e[1] for e in ev if e[0] == "error"] == damaged, ev
    checksum_errors = 0
    for r in range(4):
        ev = res[2 + r].value
        applied = _events(res[2 + r], "applied")
        assert [e[1] for e in applied] == [1, 7] and all(e[2] == [] for e in applied), ev  # never served
        checksum_errors += sum(1 for e in ev if e[0] == "error" and e[1] == "ChecksumError")
    assert checksum_errors == len(damaged)  # each damaged bucket caught by its receiver
