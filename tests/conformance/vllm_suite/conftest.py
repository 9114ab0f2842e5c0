"""Fixtures that describe weightbridge's own vLLM integration to the conformance suite."""

import pytest
import wbconf_vllm_sides


@pytest.fixture(scope="session")
def wb_vllm_model(tmp_path_factory):
    """The bundled tiny-qwen2-vllm as a float32 HF checkpoint (random init), written once per session."""
    from weightbridge.testing._internal.vllm_selfcheck import write_model

    return write_model(tmp_path_factory.mktemp("tiny-qwen2-vllm"), "qwen2")


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
