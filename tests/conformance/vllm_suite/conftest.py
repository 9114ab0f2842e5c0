"""Fixtures that describe weightbridge's own vLLM integration to the conformance suite."""

import pytest
import wbconf_vllm_sides


@pytest.fixture(scope="session")
def wb_vllm_model(tmp_path_factory):
    """The bundled tiny-qwen2-vllm's config.json only: no checkpoint (the engine builds the model with
    dummy weights; the trainer from the config, random init)."""
    from weightbridge.testing._internal.vllm_selfcheck import hf_config

    directory = tmp_path_factory.mktemp("tiny-qwen2-vllm")
    hf_config("qwen2").save_pretrained(directory)
    return directory


@pytest.fixture
def wb_spec(wb_vllm_model, tmp_path_factory):
    """FSDP2 dp 2 (float32) -> 2 vLLM engines of TP 1 (the suite writes each run's sync section)."""
    from weightbridge.testing._internal.vllm_selfcheck import spec_text

    path = tmp_path_factory.mktemp("vllm-spec") / "weightbridge.yaml"
    path.write_text(spec_text("qwen2", wb_vllm_model, tp=1, mode="sync", instances=2))
    return path


@pytest.fixture
def wb_trainer():
    return wbconf_vllm_sides.QwenFSDP2TrainerRank


@pytest.fixture
def wb_rollout():
    return "weightbridge.integrations.vllm.conformance:build_rollout"


@pytest.fixture
def wb_rollout_scope():
    return "instance"
