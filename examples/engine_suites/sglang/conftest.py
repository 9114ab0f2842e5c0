"""weightbridge's SGLang integration described to the conformance suite (the contract: ``help(weightbridge.testing)``).

Trainer: the spec's model under FSDP2 (``weightbridge.demo.fsdp2:SpecModelTrainerRank``, 2 Gloo
ranks). Rollout: one real ``sglang.Engine`` per rollout instance, started inside the suite's rank
process (``weightbridge.integrations.sglang.conformance:build_rollout``; scope ``"instance"``).
No checkpoint: the spec names a bundled model and SGLang builds it with dummy weights.
"""

from pathlib import Path

import pytest


@pytest.fixture
def wb_spec():
    return Path(__file__).parent / "weightbridge.yaml"


@pytest.fixture
def wb_trainer():
    return "weightbridge.demo.fsdp2:SpecModelTrainerRank"


@pytest.fixture
def wb_rollout():
    return "weightbridge.integrations.sglang.conformance:build_rollout"


@pytest.fixture
def wb_rollout_scope():
    return "instance"
