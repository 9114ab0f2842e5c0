"""`weightbridge explain` shows the checkpoint casts: values of a canonical tensor whose checkpoint
dtype is narrower than the rollout's pass through it (what an engine loading the checkpoint holds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SPEC = """version: 1
model:
  tensors:
    - {name: model.embed_tokens.weight, shape: [64, 32], dtype: float32}
    - {name: model.layers.0.linear_attn.A_log, shape: [4], dtype: bfloat16}
rollout: {preset: none, axes: [tp], rules: [{local: "{*}", canonical: "{*}"}], dtype: float32}
trainer: {preset: hf, dtype: float32}
"""


def _explain(spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightbridge", "explain", str(spec), "--side", "rollout",
                           "--rank", "0", *args], capture_output=True, text=True, timeout=120)


def test_explain_shows_the_checkpoint_cast(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    proc = _explain(spec, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["casts"] == [{"tensor": "model.layers.0.linear_attn.A_log", "canonical": "model.layers.0.linear_attn.A_log",
                             "checkpoint_dtype": "bfloat16", "dtype": "float32"}]
    proc = _explain(spec, "--tensor", "*A_log")
    assert "model.layers.0.linear_attn.A_log [4] float32 (values through the checkpoint's bfloat16)" in proc.stdout
    proc = _explain(spec, "--tensor", "*embed*", "--json")
    assert "casts" not in json.loads(proc.stdout)  # fp32 in the checkpoint: nothing to round
