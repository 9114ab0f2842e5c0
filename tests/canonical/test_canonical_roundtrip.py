"""Meta instantiation == a real checkpoint: save tiny random models, read their headers back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightbridge.canonical import bundled_config_path, from_hf_config, from_safetensors
from weightbridge.canonical.hf_config import _prepare

TINY = ["tiny-qwen2", "tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"]


def _save_real_model(name: str, out: Path, max_shard_size: str | None) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = json.loads(bundled_config_path(name).read_text())
    config = CONFIG_MAPPING[raw["model_type"]].from_dict(_prepare(raw))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # as from_pretrained does (some transformers versions skip it in from_config)
    strict = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if any(f".{k}." in f".{name}." for k in strict):
            t.data = t.data.float()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_roundtrip_matches_meta(name: str, sharded: bool, tmp_path: Path) -> None:
    _save_real_model(name, tmp_path, "64KB" if sharded else None)
    assert (tmp_path / "model.safetensors.index.json").is_file() == sharded
    on_disk = from_safetensors(tmp_path)
    from_meta = from_hf_config(tmp_path / "config.json", use_cache=False)
    assert on_disk.tensors == from_meta.tensors
    assert on_disk.params == from_meta.params
    bundled = from_hf_config(bundled_config_path(name))
    assert bundled.tensors == on_disk.tensors
