"""A Megatron-Core trainer and weightbridge's vLLM integration described to the conformance suite
(``wb_spec`` and ``wb_rollout_scope``: ``../conftest.py``).

Trainer: Megatron-Core at the spec's ``trainer.mesh``, local layer spec, random init
(``weightbridge.integrations.megatron.cpu_trainer:MegatronTrainerRank``, 2 Gloo ranks). Rollout: one
real ``vllm.LLM`` per rollout instance, started inside the suite's rank process
(``weightbridge.integrations.vllm.conformance:build_rollout``; scope ``"instance"``). No checkpoint:
the spec names a config.json only; vLLM builds the model with dummy weights.
"""

import pytest


@pytest.fixture
def wb_trainer():
    return "weightbridge.integrations.megatron.cpu_trainer:MegatronTrainerRank"


@pytest.fixture
def wb_rollout():
    return "weightbridge.integrations.vllm.conformance:build_rollout"
