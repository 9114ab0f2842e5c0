"""Hostile clients against real processes (issue 13): a stranger without the job secret, on the same store.

The parent hosts the TCPStore; genuine ranks and strangers are separate processes
(``launch``), each given its secret explicitly.
"""

from __future__ import annotations

import pytest

from weightbridge.localrun import launch
from weightbridge.transport.store import open_store

import sync_auth_workers as W

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SECRET = "genuine-" + "s" * 24


def spec(timeout_s: float = 3.0) -> str:
    return ("version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2, mesh: {dp: 2}}\n"
            "rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}\n"
            f"sync: {{mode: sync, round_bytes: 8KiB, timeout_s: {timeout_s}, heartbeat_s: 0.1}}\n")


@pytest.mark.parametrize("stranger_secret", [None, "wrong-" + "w" * 24])
def test_a_stranger_posing_as_the_trainers_gets_no_rollout_to_apply_its_weights(stranger_secret):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    text = spec()
    procs = [(W.genuine_rollout, (text, r, store.port, SECRET, 8.0)) for r in range(2)]
    procs += [(W.stranger_trainer, (text, t, store.port, stranger_secret)) for t in range(2)]
    res = launch(_call, procs, timeout_s=40)
    for i in (0, 1):  # the rollouts: never applied anything, never torn
        assert res[i].ok, res[i].traceback
        ev = res[i].value
        assert [e for e in ev if e[0] == "applied"] == [], ev
        assert ev[-1] == ("final", None, False), ev
        # errors seen (a forged announcement, ...) are BridgeErrors: the worker catches only those
    for i in (2, 3):  # the strangers: typed errors, never a push that returned
        assert res[i].ok, res[i].traceback
        (kind, etype, msg), = res[i].value
        assert kind == "error", res[i].value  # a BridgeError (the worker catches only those)
        if stranger_secret is None:
            assert etype == "AuthError"


@pytest.mark.parametrize("seal", [True, False])
def test_a_wrong_secret_rank_in_the_data_group_is_refused_before_any_data(seal):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    secrets = [SECRET, SECRET, "wrong-" + "w" * 24]
    res = launch(_call, [(W.data_group_member, (r, store.port, secrets[r], seal)) for r in range(3)], timeout_s=40)
    out = [x.value for x in res]
    assert all(x.ok for x in res), [x.traceback for x in res]
    assert all(o[0] == "error" for o in out), out
    if not seal:  # the rendezvous let the stranger in: the data-sender check refuses it, naming the spec ranks
        for r in (0, 1):
            assert out[r][1] == "UnauthenticatedPeer" and "rollout 1" in out[r][2], out[r]


def test_the_data_sender_check_passes_between_genuine_ranks_and_is_cheap():
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    res = launch(_call, [(W.data_group_member, (r, store.port, SECRET, True)) for r in range(3)], timeout_s=40)
    out = [x.value for x in res]
    assert all(o[0] == "ok" for o in out), out
    assert max(o[1] for o in out) < 2.0  # one 16-byte round trip per peer per epoch (typically milliseconds)
    print("data-sender check seconds per rank:", [round(o[1], 4) for o in out])


def _call(fn, args):
    return fn(*args)
