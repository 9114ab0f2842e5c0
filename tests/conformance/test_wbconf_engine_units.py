"""The engine units' settings without an engine: where the engine's model comes from (no checkpoint
needed), the suite settings the units ask for. The real runs: ``vllm_suite/`` and ``sglang_suite/``
(config.json only, dummy weights)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from weightbridge.integrations._engine.conformance import engine_model


def _spec(tmp_path, model: str):
    path = tmp_path / "weightbridge.yaml"
    path.write_text(f"version: 1\nmodel: {model}\ntrainer: {{preset: fsdp2, mesh: {{dp: 2}}}}\n"
                    "rollout: {preset: vllm, mesh: {tp: 1}}\n")
    return path


def test_the_engine_model_needs_no_checkpoint(tmp_path):
    folder, weights = engine_model(_spec(tmp_path, "{bundled: tiny-qwen2-vllm}"), tmp_path / "run")
    assert folder == tmp_path / "run" / "engine-model" and weights is False
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert engine_model(_spec(tmp_path, "{config: m/config.json}"), tmp_path) == (tmp_path / "m", False)
    assert engine_model(_spec(tmp_path, "{config: m}"), tmp_path) == (tmp_path / "m", False)
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    assert engine_model(_spec(tmp_path, "{config: m/config.json}"), tmp_path) == (tmp_path / "m", True)
    assert engine_model(_spec(tmp_path, "{safetensors: m/model.safetensors}"), tmp_path) == (tmp_path / "m", True)


@pytest.mark.parametrize("model, why", [
    ("{config: nowhere/config.json}", r"model.config: no config.json in .*nowhere"),
    ("{tensors: [{name: w, shape: [2], dtype: float32}]}", "give model.config"),
])
def test_an_engine_model_it_cannot_build_names_the_spec(tmp_path, model, why):
    with pytest.raises(ValueError, match=why) as info:
        engine_model(_spec(tmp_path, model), tmp_path)
    assert str(tmp_path / "weightbridge.yaml") in str(info.value) and "vLLM" not in str(info.value)


_SETTINGS = """
import json, sys
from weightbridge.testing import ConformanceSuite
class RefuseEngines:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "sglang"):
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, RefuseEngines())
class Plain(ConformanceSuite):
    pass
class Mine(ConformanceSuite):
    startup_s = 12.0
toy = "weightbridge.localrun:launch"  # any factory that asks for nothing
out = {}
for engine in ("vllm", "sglang"):
    ref = "weightbridge.integrations.%s.conformance:build_rollout" % engine
    out[engine] = [Plain()._setting("startup_s", toy, ref), Plain()._setting("timeout_s", toy, ref),
                   Mine()._setting("startup_s", toy, ref)]
out["toy"] = [Plain()._setting("startup_s", toy), Plain()._setting("timeout_s", toy)]
print(json.dumps(out))
"""


def test_the_suite_takes_the_engine_units_settings_unless_the_class_sets_its_own():
    """Issue 33: the suite's 30 s / 5 s defaults were too short for a real engine (integrators needed
    180-300 s / 10-20 s) and nothing said so; the units now ask for what their engine needs, and
    reading that imports no engine."""
    out = subprocess.run([sys.executable, "-c", _SETTINGS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"vllm": [180.0, 10.0, 12.0], "sglang": [300.0, 15.0, 12.0], "toy": [30.0, 5.0]}
