"""``weightbridge demo --json`` as a new user runs it: a subprocess, exit 0, ``"verified": true``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.multiprocess
@pytest.mark.slow
def test_weightbridge_demo_json_exits_0_with_every_update_verified_bitwise(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "weightbridge", "demo", "--json", "--timeout", "100"],
        capture_output=True, text=True, timeout=150, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # progress goes to stderr: stdout is the report alone
    assert "trainer world up" in proc.stderr and "push v6 (async): applied on 4/4" in proc.stderr, proc.stderr[-2000:]
    assert report["verified"] is True and report["errors"] == []
    rows = report["steps"]
    assert [(r["version"], r["mode"]) for r in rows] == [
        (1, "sync"), (2, "sync"), (3, "sync"), (4, "async"), (5, "async"), (6, "async"),
    ]
    assert all(r["verified"] and r["receivers"] == 4 and r["bytes"] > 0 for r in rows)
    losses = [r["loss"] for r in rows]
    assert len(set(losses)) == len(losses)  # real optimizer steps: every version is new


def test_demo_rejects_unknown_modes():
    proc = subprocess.run([sys.executable, "-m", "weightbridge", "demo", "--modes", "sideways"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "takes sync and/or async" in proc.stderr and proc.stdout == ""
