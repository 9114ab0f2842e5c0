"""The colocated data plane streaming into an engine, used directly by 4 real processes (no bridge).

FSDP2 dp2 -> vLLM-layout TP2 over ``sync.transport: shm``; trainer 1 is stated to be on another host, so
a push mixes the shared-memory pairs (trainer 0) with Gloo pairs (trainer 1). The rollout ranks stream
(tensors given as shapes only): every local tensor reaches the sink exactly once per version, complete
and bitwise. ~15 s on 2 cores.
"""

from __future__ import annotations

import os

import pytest

import transport_local_workers as W
from weightbridge.localrun import launch
from weightbridge.transport.segment import SHM_DIR
from weightbridge.transport.store import open_store

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm")]

SPEC = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync: {round_bytes: 16KiB, transport: shm}
"""


def test_a_push_mixing_shared_memory_and_gloo_pairs_streams_every_tensor_once_bitwise():
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)
    base = {"spec": SPEC, "port": store.port, "versions": [1, 2], "away": [1]}
    cfgs = [({**base, "side": side, "rank": k},) for side in ("trainer", "rollout") for k in range(2)]
    res = launch(W.member, cfgs, timeout_s=90)
    for r in res:
        assert r.ok, (r.error, r.traceback, r.timed_out, r.exitcode)
    assert not any(r.value["all_local"] for r in res)
    assert [r.value["local"] for r in res] == [[2, 3], [], [0, 3], [0, 2]]  # trainer 1's pairs: Gloo
    for r in res[2:]:
        for run in r.value["runs"]:
            assert run["bad"] == [], run["bad"][:3]
            assert sorted(run["writes"]) == run["names"]  # every local tensor handed over exactly once
            assert 0 < run["stream_bytes"]
