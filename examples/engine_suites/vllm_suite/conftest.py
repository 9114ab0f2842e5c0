"""weightbridge's vLLM integration described to the conformance suite (``wb_spec`` and ``wb_rollout_scope``: ``../conftest.py``).

Trainer: the spec's model under FSDP2 (``weightbridge.demo.fsdp2:SpecModelTrainerRank``, 2 Gloo
ranks). Rollout: one real ``vllm.LLM`` per rollout instance, started inside the suite's rank
process (``weightbridge.integrations.vllm.conformance:build_rollout``; scope ``"instance"``).
No checkpoint: the spec names a bundled model and vLLM builds it with dummy weights.
"""

import pytest


@pytest.fixture
def wb_trainer():
    return "weightbridge.demo.fsdp2:SpecModelTrainerRank"


@pytest.fixture
def wb_rollout():
    return "weightbridge.integrations.vllm.conformance:build_rollout"
