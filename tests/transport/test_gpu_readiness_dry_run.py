"""``python bench/gpu_readiness.py --dry-run``: the GPU readiness script runs every stage's code on CPU.

The script is what a lent GPU machine runs once, under a fixed time budget: a mistake in it costs
that machine. Here every stage runs with its CPU stand-ins (the loopback NCCL, a recording stand-in
for CUDA streams, a stated GPU identity), in fresh processes as on the GPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_passes_every_stage(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_readiness.py"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    report = json.loads((tmp_path / "gpu_readiness.json").read_text())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert report["dry_run"] and report["status"] == "PASS"
    stages = report["stages"]
    assert list(stages) == ["versions", "nccl_calls", "executor", "micro", "cuda_gloo", "two_ranks_one_gpu", "cuda_ipc"]
    assert {name: s["status"] for name, s in stages.items()} == {name: "PASS" for name in stages}
    checks = {c["name"] for s in stages.values() for c in s.get("checks", [])}
    for expected in ("every private torch API of _torch_compat exercised",
                     "init aborted at the deadline (the other rank never comes)",
                     "callers on non-default streams", "int8/bool/fp8 items at odd slab offsets, checksums",
                     "delta updates (two versions)", "pack many small items"):
        assert expected in checks
    assert all(b["error"] == "DeviceConflict" for b in stages["two_ranks_one_gpu"]["bridge"])
    # the CUDA IPC stage's two-process protocol, through /dev/shm: every version bitwise, no wire, no segment left
    ipc = stages["cuda_ipc"]
    assert [(r["side"], r["versions"], r["mismatches"] if r["side"] == "rollout" else []) for r in ipc["ranks"]] == [
        ("trainer", [1, 2, 3], []), ("rollout", [1, 2, 3], [])]
    assert ipc["ranks"][0]["plane"] == ["LocalDataPlane", "shm", True] and ipc["segments_left"] == []
    assert (tmp_path / "gpu_readiness.log").read_text().rstrip().splitlines()[-1].split("] ")[1].startswith("PASS")
