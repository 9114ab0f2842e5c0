"""`weightbridge explain` shows a rank's local tensors as canonical boxes; --json is a stable format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "spec" / "examples" / "tiny_fsdp2_to_vllm.yaml"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightbridge", *args], capture_output=True, text=True, timeout=120)


def test_explain_json_exact_boxes() -> None:
    proc = _run("explain", str(TINY), "--side", "rollout", "--rank", "3", "--tensor", "model.layers.0.self_attn.qkv_proj.weight", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {
        "side": "rollout",
        "rank": 3,
        "instance": 1,
        "local_rank": 1,
        "coords": {"ep": 0, "etp": 1, "pp": 0, "tp": 1},
        "tensors": [
            {
                "name": "model.layers.0.self_attn.qkv_proj.weight",
                "shape": [64, 64],
                "dtype": "bfloat16",
                "pieces": [
                    {"canonical": "model.layers.0.self_attn.q_proj.weight", "canonical_box": [[32, 64], [0, 64]], "local_box": [[0, 32], [0, 64]], "transpose": False},
                    {"canonical": "model.layers.0.self_attn.k_proj.weight", "canonical_box": [[16, 32], [0, 64]], "local_box": [[32, 48], [0, 64]], "transpose": False},
                    {"canonical": "model.layers.0.self_attn.v_proj.weight", "canonical_box": [[16, 32], [0, 64]], "local_box": [[48, 64], [0, 64]], "transpose": False},
                ],
            }
        ],
    }


def test_explain_filter_by_canonical_name_and_human_output() -> None:
    proc = _run("explain", str(TINY), "--side", "trainer", "--rank", "1", "--tensor", "model.embed_tokens.weight")
    assert proc.returncode == 0, proc.stderr
    assert "trainer rank 1" in proc.stdout
    assert "[0:64, 0:64]" in proc.stdout and "model.embed_tokens.weight[64:128, 0:64]" in proc.stdout


def test_explain_bad_rank_and_bad_spec_exit_2() -> None:
    proc = _run("explain", str(TINY), "--side", "trainer", "--rank", "9")
    assert proc.returncode == 2 and "ranks 0..1" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run("explain", str(ROOT / "tests/spec/data/five_mistakes.yaml"), "--side", "trainer", "--rank", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "$.rollout.preset" in proc.stderr
