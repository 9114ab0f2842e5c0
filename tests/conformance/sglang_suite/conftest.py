"""Fixtures that describe weightbridge's own SGLang integration to the conformance suite."""

import pytest
import wbconf_sglang_sides


@pytest.fixture(scope="session")
def wb_sglang_model(tmp_path_factory):
    """The bundled tiny-qwen2-vllm's config.json only: no checkpoint (the engine builds the model with
    dummy weights; the trainer from the config, random init)."""
    from weightbridge.testing._internal.vllm_selfcheck import hf_config

    directory = tmp_path_factory.mktemp("tiny-qwen2-sglang")
    hf_config("qwen2").save_pretrained(directory)
    return directory


@pytest.fixture
def wb_spec(wb_sglang_model, tmp_path_factory):
    """FSDP2 dp 2 (float32) -> 1 SGLang engine of TP 1 (the suite writes each run's sync section)."""
    from weightbridge.testing._internal.sglang_selfcheck import spec_text

    path = tmp_path_factory.mktemp("sglang-spec") / "weightbridge.yaml"
    path.write_text(spec_text("qwen2", wb_sglang_model, tp=1, mode="sync", instances=1))
    return path


@pytest.fixture
def wb_trainer():
    return wbconf_sglang_sides.QwenFSDP2TrainerRank


@pytest.fixture
def wb_rollout():
    return "weightbridge.integrations.sglang.conformance:build_rollout"


@pytest.fixture
def wb_rollout_scope():
    return "instance"
