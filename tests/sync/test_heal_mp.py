"""Issue 13 over Gloo in processes: async heals after a slow apply; trainers see a receiver's ChecksumError.

The parent hosts the TCPStore (port 0); every test runs under ``launch(timeout_s=...)`` (SIGKILL at
the deadline), so nothing hangs. The thread-level matrix (failed push, restarted rollout, bad store
values, in-time failures) is ``test_heal_threads.py``.
"""

from __future__ import annotations

import pytest

import sync_heal_workers as H
from sync_harness import spec_text
from weightbridge.localrun import launch
from weightbridge.transport.store import open_store

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ONE_TRAINER = "{preset: fsdp2, mesh: {dp: 1}}"
ONE_ROLLOUT = "{preset: vllm, instances: 1, mesh: {tp: 1}}"


def run(procs, timeout_s=90):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    res = launch(H.main, [(role, text, rank, store.port, opts) for role, text, rank, opts in procs], timeout_s=timeout_s)
    for x in res:
        assert x.ok, (x.error, x.traceback, x.timed_out, x.exitcode)
    return [x.value for x in res]


@pytest.mark.parametrize("staging", [True, False], ids=["staging", "in-place"])
def test_reproducer_async_one_apply_slower_than_timeout_then_every_next_push_succeeds(staging):
    timeout_s = 2.0
    text = spec_text(mode="async", timeout_s=timeout_s, heartbeat_s=0.2, trainer=ONE_TRAINER, rollout=ONE_ROLLOUT)
    trainer, rollout = run([
        ("trainer", text, 0, {"versions": [1, 2, 3, 4, 5], "stop_on_error": False}),
        ("rollout", text, 0, {"last": 5, "staging": staging, "slow_apply": {1: 1.5 * timeout_s}}),
    ])
    kinds = [(e[0], e[1]) for e in trainer]
    assert kinds == [("pushed", 1), ("error", 2), ("pushed", 3), ("pushed", 4), ("pushed", 5)], trainer
    assert trainer[1][2] == "DeadlineExceeded" and "max_staleness 1" in trainer[1][3]
    applied = [e for e in rollout if e[0] == "applied"]
    assert [e[1] for e in applied] == [1, 3, 4, 5] and all(e[2] == [] for e in applied), applied


def test_trainers_see_the_receivers_checksum_error_not_a_disconnect():
    timeout_s = 6.0
    text = spec_text(mode="sync", timeout_s=timeout_s, heartbeat_s=0.2, checksums=True, transport="gloo",
                     rollout="{preset: vllm, instances: 1, mesh: {tp: 2}}")  # the wire's trailer (shm: test_colocated_mp)
    opts = {"versions": [1, 2, 3], "stop_on_error": False}
    t0, t1, r0, r1 = run([
        ("trainer", text, 0, opts), ("trainer", text, 1, opts),
        ("rollout", text, 0, {"last": 3, "staging": True}),
        ("rollout", text, 1, {"last": 3, "staging": False, "damage": 2}),
    ])
    for t in (t0, t1):
        assert [(e[0], e[1]) for e in t] == [("pushed", 1), ("error", 2), ("pushed", 3)], t
        _, _, etype, msg, _, elapsed = t[1]
        # before: PeerDisconnected (... sending chunk ...); now the receiver's own finding
        assert etype == "PeerFailed" and "rollout 1" in msg and "ChecksumError" in msg, msg
        assert elapsed < timeout_s + 2.0
    errors = [e for e in r1 if e[0] == "error"]
    assert errors and errors[0][1] == "ChecksumError", r1
    # Rollout 0 was waiting for trainer 0's bytes when trainer 0 gave up: it must hear of it from
    # the closed sockets at once, not at its own deadline (before the fix: 6 s, so trainer 0's
    # next handshake, started meanwhile, timed out waiting for rollout 0's hello).
    r0_errors = [e for e in r0 if e[0] == "error"]
    assert r0_errors and r0_errors[0][3] - errors[0][3] < timeout_s / 2, (r0_errors, errors)
    for ev in (r0, r1):  # healed by the next push, bitwise
        applied = [e for e in ev if e[0] == "applied"]
        assert [e[1] for e in applied] == [1, 3] and all(e[2] == [] for e in applied), ev
