"""load_canonical: the four source kinds, dtype/params options, and error reporting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from weightbridge.canonical import CanonicalSourceError, bundled_config_path, load_canonical


def test_config_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    shutil.copy(bundled_config_path("tiny-qwen2"), tmp_path / "m" / "config.json")
    by_dir = load_canonical({"config": "m"}, tmp_path)
    by_file = load_canonical({"config": "m/config.json"}, tmp_path)
    bundled = load_canonical({"bundled": "tiny-qwen2"}, tmp_path)
    assert by_dir.tensors == by_file.tensors == bundled.tensors
    assert by_dir.params == bundled.params
    assert by_file.source == f"config:{tmp_path / 'm' / 'config.json'}"


def test_dtype_and_params_options() -> None:
    m = load_canonical({"bundled": "tiny-deepseek-v3", "dtype": "float16", "params": {"num_layers": 99, "x": 1}}, ".")
    assert m["model.embed_tokens.weight"].dtype == "float16"
    assert m["model.layers.2.mlp.gate.e_score_correction_bias"].dtype == "float32"
    assert m.param_dict["num_layers"] == 99 and m.param_dict["x"] == 1
    assert [k for k, _ in m.params] == sorted(k for k, _ in m.params)


def test_inline_and_safetensors_dtype_override(tmp_path: Path) -> None:
    tensors = [
        {"name": "a", "shape": [64, 64], "dtype": "bf16"},
        {"name": "bias", "shape": [8], "dtype": "fp32"},
        {"name": "idx", "shape": [8], "dtype": "int64"},
    ]
    m = load_canonical({"tensors": tensors, "dtype": "fp16"}, tmp_path)
    assert [t.dtype for t in m] == ["float16", "float32", "int64"]

    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(4, 4, dtype=torch.bfloat16), "b": torch.zeros(4)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "torch_dtype": "bfloat16"}))
    s = load_canonical({"safetensors": ".", "dtype": "float32"}, tmp_path)
    assert {t.name: t.dtype for t in s} == {"w": "float32", "b": "float32"}
    s16 = load_canonical({"safetensors": "model.safetensors", "dtype": "float16"}, tmp_path)
    assert {t.name: t.dtype for t in s16} == {"w": "float16", "b": "float32"}
    assert s16.param_dict["model_type"] == "x"


@pytest.mark.parametrize(
    ("source", "key", "match"),
    [
        ({"config": "missing/config.json"}, "config", "no such file or directory: .*missing/config.json"),
        ({"config": "."}, "config", "directory has no config.json"),
        ({"safetensors": "nothing.safetensors"}, "safetensors", "no such file or directory"),
        ({"bundled": "nope"}, "bundled", "unknown bundled model 'nope'"),
        ({"bundled": 3}, "bundled", "expected a name"),
        ({}, "model", "needs exactly one of bundled, config, safetensors, tensors"),
        ({"bundled": "tiny-qwen2", "config": "x"}, "model", "got bundled, config"),
        ({"bundled": "tiny-qwen2", "dtyp": "bf16"}, "model", "unknown key"),
        ({"bundled": "tiny-qwen2", "dtype": "bf17"}, "dtype", "not a floating dtype"),
        ({"bundled": "tiny-qwen2", "params": [1]}, "params", "mapping"),
        ({"tensors": "x"}, "tensors", "must be a list"),
    ],
)
def test_errors(source: dict, key: str, match: str, tmp_path: Path) -> None:
    with pytest.raises(CanonicalSourceError, match=match) as err:
        load_canonical(source, tmp_path)
    assert err.value.key == key
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith("model")


def test_not_a_mapping() -> None:
    with pytest.raises(CanonicalSourceError, match="expected a mapping"):
        load_canonical(["bundled"], ".")  # type: ignore[arg-type]


def test_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, weightbridge.canonical; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
