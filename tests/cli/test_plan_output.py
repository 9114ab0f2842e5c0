"""``weightbridge plan`` states where its cost model places the ranks (text and ``--json``), names no GPU for a
CPU/Gloo spec, and ``weightbridge --version`` names the distribution pip knows (``weightbridge-rl``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = """\
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}}
"""


def wb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightbridge", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("extra", "placement", "text"), [
    ("", {"sides": "disjoint", "ranks_per_node": 8, "trainer_nodes": 1, "rollout_nodes": 1},
     "trainer ranks on 1 node(s), rollout ranks on 1 other node(s), 8 ranks per node (rank r on node r // 8 of its "
     "side): every trainer -> rollout byte crosses the NICs"),
    ("network: {preset: h100, ranks_per_node: 2, shared_nodes: true}\n",
     {"sides": "shared", "ranks_per_node": 2, "trainer_nodes": 1, "rollout_nodes": 2},
     "both sides on the same 2 node(s), 2 ranks per node: trainer rank s and rollout rank r share a node iff "
     "s // 2 == r // 2"),
    ("network: cpu-gloo\n", {"sides": "shared", "ranks_per_node": 1024, "trainer_nodes": 1, "rollout_nodes": 1},
     "both sides on the same 1 node(s), 1024 ranks per node"),
])
def test_plan_states_its_node_placement(tmp_path: Path, extra: str, placement: dict, text: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(TINY + extra)
    data = json.loads(wb("plan", str(spec), "--json").stdout)
    assert {k: v for k, v in data["placement"].items() if k != "text"} == placement
    assert data["placement"]["text"].startswith(text)
    shown = wb("plan", str(spec)).stdout
    assert f"placement: {data['placement']['text']} (the network model's assumption" in shown.replace("\n", " ")


def test_colocated_placement(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(TINY.replace("instances: 2, mesh: {tp: 2}", "mesh: {tp: 2}") + "sync: {mode: colocated}\n")
    data = json.loads(wb("plan", str(spec), "--json").stdout)
    assert data["placement"]["sides"] == "colocated" and data["placement"]["text"].startswith(
        "colocated: trainer rank i and rollout rank i share GPU i")


@pytest.mark.parametrize(("extra", "label"), [
    ("", "GPU stall (sync)"),
    ("sync: {transport: gloo}\n", "rank stall (sync)"),
    ("network: cpu-gloo\n", "rank stall (sync)"),
])
def test_a_cpu_spec_has_no_gpu_stall_line(tmp_path: Path, extra: str, label: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(TINY + extra)
    out = wb("plan", str(spec))
    assert out.returncode == 0, out.stderr
    assert label in out.stdout
    assert ("GPU" in out.stdout) == (label.startswith("GPU"))


def test_version_names_the_distribution() -> None:
    out = wb("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("weightbridge 0.") and "weightbridge-rl" in out.stdout
