"""The bridge across real processes over Gloo: end to end, killed processes, handshake mismatches.

The parent hosts the TCPStore (port 0: no port race) so that any rank may be killed. Every
test runs its processes under ``launch(timeout_s=...)``, which SIGKILLs whatever is still
running at the deadline: no test can hang. Kills happen from inside the data plane's
``on_round`` progress hook, i.e. mid-update, after a given round.
"""

from __future__ import annotations

import pytest

import sync_mp_workers as W
from sync_harness import spec_text
from weightbridge.testing.localrun import launch
from weightbridge.transport.store import open_store

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 4.0  # sync.timeout_s of these specs: every wait's deadline
SLACK_S = 2.0
ONE_INSTANCE = "{preset: vllm, instances: 1, mesh: {tp: 2}}"


def spec(**kw) -> str:
    kw.setdefault("timeout_s", TIMEOUT_S)
    return spec_text(heartbeat_s=0.2, **kw)


def run(procs, timeout_s=45):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    args = [(role, text, rank, store.port, opts) for role, text, rank, opts in procs]
    res = launch(W.main, args, timeout_s=timeout_s)
    killed = float(store.get("test/killed_at")) if store.check(["test/killed_at"]) else None
    return res, killed


def events(res, kind):
    assert res.ok, (res.error, res.traceback, res.timed_out, res.exitcode)
    return [e for e in res.value if e[0] == kind]


@pytest.mark.parametrize("mode,checksums", [("sync", False), ("async", True)])
def test_fsdp2_dp2_to_two_vllm_tp2_instances_bitwise_over_gloo(mode, checksums):
    text = spec(mode=mode, checksums=checksums)
    procs = [("trainer", text, t, {"versions": [1, 2, 3]}) for t in range(2)]
    procs += [("rollout", text, r, {"last": 3, "staging": r % 2 == 0, "identities": True}) for r in range(4)]
    res, _ = run(procs)
    for t in (0, 1):
        assert [e[1] for e in events(res[t], "pushed")] == [1, 2, 3]
    for r in range(4):
        applied = events(res[2 + r], "applied")
        assert [e[1] for e in applied] == [1, 2, 3]
        assert all(e[3] == [] for e in applied), applied  # bitwise, every piece
    # every hello stated the real identity: Gloo on the CPU of this host (the processes' own host identity)
    [(_, stated, host)] = events(res[2], "identity")
    assert sorted(stated) == ["rollout 0", "rollout 1", "rollout 2", "rollout 3", "trainer 0", "trainer 1"]
    assert all(i == {"backend": "gloo", "host": host, "device": "cpu", "label": "cpu"} for i in stated.values()), stated


def test_a_sender_killed_mid_round_fails_everyone_in_time_keeps_staged_and_heals_torn():
    text = spec(mode="sync")  # 8KiB rounds: 22 rounds
    procs = [
        ("trainer", text, 0, {"versions": [1, 2, 3], "stop_on_error": False}),
        ("trainer", text, 1, {"versions": [1, 2], "kill": (2, 1)}),  # SIGKILL after round 1 of v2
        ("trainer", text, 1, {"versions": [3], "after_kill": True}),  # the restarted trainer 1
    ]
    procs += [("rollout", text, r, {"last": 3, "staging": r < 2}) for r in range(4)]
    res, killed = run(procs)
    assert killed is not None and res[1].exitcode == -9
    t0 = res[0].value
    assert [e[0] for e in t0] == ["pushed", "error", "pushed"]
    assert t0[1][4] - killed < TIMEOUT_S + SLACK_S  # typed error within the deadline
    assert t0[2][2] == 2  # v3 in a new epoch
    assert [e[:2] for e in events(res[2], "pushed")] == [("pushed", 3)]
    for r in range(4):
        ev = res[3 + r].value
        err = events(res[3 + r], "error")[0]
        _, etype, msg, when, torn, version, keep = err
        assert etype in ("PeerFailed", "PeerDisconnected", "PeerTimeout", "DeadlineExceeded") and when - killed < TIMEOUT_S + SLACK_S
        if r < 2:  # staging: the previous version is intact and still served
            assert (torn, version, keep) == (False, 1, [])
        else:  # in place: torn, apply() refuses, until the next complete push
            assert (torn, version) == (True, None)
            assert events(res[3 + r], "torn-apply")[0][1] == "TornModelError"
        assert [(e[1], e[3]) for e in events(res[3 + r], "applied")] == [(1, []), (3, [])]
        assert ev[-1][:3] == ("final", 3, False)


def test_a_receiver_killed_mid_round_fails_everyone_in_time_and_the_next_push_drops_its_instance():
    text = spec(mode="sync", min_instances=1)
    opts = {"versions": [1, 2, 3, 4], "stop_on_error": False, "await_rollouts": 4}
    procs = [("trainer", text, t, opts) for t in range(2)]
    procs += [("rollout", text, r, {"last": 4, "staging": r < 2, **({"kill": (2, 1)} if r == 3 else {})})
              for r in range(4)]
    res, killed = run(procs)
    assert killed is not None and res[5].exitcode == -9
    for t in (0, 1):
        ev = res[t].value
        assert ev[0][:2] == ("pushed", 1)
        assert ev[1][0] == "error" and ev[1][1] == 2 and ev[1][4] - killed < TIMEOUT_S + SLACK_S
        # v3: the dead rank never says hello; its heartbeat stops: PeerFailed naming it
        assert ev[2][0] == "error" and ev[2][2] == "PeerFailed" and "rollout 3" in ev[2][3]
        assert ev[3][0] == "pushed" and ev[3][1] == 4  # v4 re-planned without instance 1
    for r in (0, 1):
        err = events(res[2 + r], "error")[0]
        assert err[3] - killed < TIMEOUT_S + SLACK_S and err[4:] == (False, 1, [])  # old version kept
        assert [(e[1], e[3]) for e in events(res[2 + r], "applied")] == [(1, []), (4, [])]
    err = events(res[4], "error")[0]  # rollout 2: in place, same instance as the dead rank
    assert err[3] - killed < TIMEOUT_S + SLACK_S and err[4:6] == (True, None)
    assert res[4].value[-1][:3] == ("final", None, True)  # still torn: its instance is incomplete


def _nccl(uuid: str) -> dict:
    return {"backend": "nccl", "device": uuid, "label": "cuda:0"}


@pytest.mark.parametrize("fault", ["spec_hash", "dtypes", "backend", "device"])
def test_a_handshake_mismatch_fails_every_rank_naming_both_sides(fault):
    """``backend``: rollout 1 states NCCL on a GPU while the others move bytes with Gloo on CPU (a
    CPU-offloaded trainer next to CUDA rollouts); ``device``: every rank states NCCL, rollouts 0 and 1
    on one GPU. Stated through the data plane's identity (a unit seam: this machine has no GPU), whose
    ``connect`` fails the test if reached: both are refused in the handshake, before any NCCL call."""
    text = spec(mode="sync", rollout=ONE_INSTANCE)
    # spec_hash: rollout 1's spec differs only in sync.checksums (a setting every rank must agree on)
    odd_text = spec(mode="sync", rollout=ONE_INSTANCE, checksums=False) if fault == "spec_hash" else text
    odd = {"dtypes": {"dtype": "float32"}, "backend": {"identity": _nccl("GPU-1111")}}.get(fault, {})
    stated = {}
    if fault == "device":  # trainers on GPUs a and b, both rollouts on GPU c
        stated = {("trainer", 0): _nccl("GPU-aaaa"), ("trainer", 1): _nccl("GPU-bbbb"),
                  ("rollout", 0): _nccl("GPU-cccc"), ("rollout", 1): _nccl("GPU-cccc")}
    procs = [("trainer", text, t, {"versions": [1], "identity": stated.get(("trainer", t))}) for t in range(2)]
    procs += [("rollout", odd_text if r == 1 else text, r,
               {"last": 1, "stop_on_error": True, "run_s": 10, "identity": stated.get(("rollout", r)),
                **(odd if r == 1 else {})}) for r in range(2)]
    res, _ = run(procs, timeout_s=30)
    kinds = [events(res[0], "error")[0][2], events(res[1], "error")[0][2]]
    kinds += [events(res[2 + r], "error")[0][1] for r in range(2)]
    msgs = [events(res[0], "error")[0][3], events(res[1], "error")[0][3]]
    msgs += [events(res[2 + r], "error")[0][2] for r in range(2)]
    for i, m in enumerate(msgs):
        who = ["trainer 0", "trainer 1", "rollout 0", "rollout 1"][i]
        if fault == "device":
            assert kinds[i] == "DeviceConflict", (kinds[i], m)
            assert m.startswith(f"{who}: handshake refused: rollout 0 and rollout 1 are both on cuda:0 (GPU-cccc)"), m
            continue
        assert kinds[i] == "HandshakeMismatch", (kinds[i], m)
        assert m.startswith(f"{who}: handshake mismatch on {fault}"), m
        assert "rollout 1" in m  # the odd rank is named on every rank
    if fault == "dtypes":
        assert "spec bfloat16, tensor float32" in msgs[0]
    if fault == "backend":
        assert "trainer 0 has gloo on cpu of host" in msgs[0] and "rollout 1 has nccl on cuda:0 (GPU-1111)" in msgs[0]
        assert "sync.transport: gloo" in msgs[0]  # the hint
    for r in range(2):
        assert events(res[2 + r], "applied") == []
