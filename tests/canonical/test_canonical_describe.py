"""summarize() and the ``weightbridge models`` subcommand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers_facts import deepseek_router_weight_fp32

from weightbridge.canonical import bundled_config_path, load_canonical
from weightbridge.canonical.describe import human_bytes, human_count, summarize
from weightbridge.cli.main import main
from weightbridge.ops.models import source_for


def test_summarize_groups() -> None:
    s = summarize(load_canonical({"bundled": "tiny-deepseek-v3"}, "."))
    groups = {g["pattern"]: g for g in s["groups"]}
    experts = groups["model.layers.*.mlp.experts.*.gate_proj.weight"]
    assert experts["count"] == 2 * 8 and experts["shapes"] == [[32, 64]] and experts["dtypes"] == ["bfloat16"]
    assert experts["bytes"] == 16 * 32 * 64 * 2
    bias = groups["model.layers.*.mlp.gate.e_score_correction_bias"]
    assert (bias["count"], bias["dtypes"], bias["bytes"]) == (2, ["float32"], 2 * 8 * 4)
    assert s["groups"][0]["pattern"] == "lm_head.weight"
    t = s["totals"]
    assert t["tensors"] == 91 == sum(g["count"] for g in s["groups"])
    assert t["bytes"] == sum(g["bytes"] for g in s["groups"])
    assert t["by_dtype"]["float32"]["tensors"] == (4 if deepseek_router_weight_fp32() else 2)
    assert s["params"]["num_experts"] == 8
    json.dumps(s)


def test_human_units() -> None:
    assert human_count(671_026_419_200) == "671.03B"
    assert human_count(999) == "999"
    assert human_bytes(1024**3 * 5 // 4) == "1.25 GiB"
    assert human_bytes(12) == "12 B"


def test_source_for(tmp_path: Path) -> None:
    assert source_for("tiny-qwen2") == {"bundled": "tiny-qwen2"}
    assert source_for("tiny-qwen2", "fp16") == {"bundled": "tiny-qwen2", "dtype": "fp16"}
    shutil.copy(bundled_config_path("tiny-qwen2"), tmp_path / "config.json")
    assert source_for(str(tmp_path)) == {"config": str(tmp_path)}
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert source_for(str(tmp_path)) == {"safetensors": str(tmp_path)}
    assert source_for(str(tmp_path / "config.json")) == {"config": str(tmp_path / "config.json")}
    assert source_for("x/model.safetensors.index.json") == {"safetensors": "x/model.safetensors.index.json"}


def test_cli_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "tiny-qwen3-moe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["tensors"] == 69 and out["source"] == "bundled:tiny-qwen3-moe"
    assert main(["models", "tiny-qwen3-moe"]) == 0
    text = capsys.readouterr().out
    assert "model.layers.*.mlp.experts.*.gate_proj.weight" in text and "69 tensors" in text
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "deepseek-v3" in text and "671.03B" in text and "tiny-qwen2" in text
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"qwen2.5-7b", "tiny-llama"}


def test_cli_models_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["models", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown bundled model 'no-such-model'" in err and "Traceback" not in err
    assert main(["models", str(tmp_path / "missing.json")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
