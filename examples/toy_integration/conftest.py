"""Fixtures the weightbridge conformance suite needs (the contract: ``help(weightbridge.testing)``).

``TOYRL_BREAK=<name>`` builds one of the deliberately broken integrations of
``toyrl.conformance.BREAKAGES`` instead (the repository's tests check each one is caught).
"""

import os
from pathlib import Path

import pytest

from toyrl.conformance import factories

TRAINER, ROLLOUT = factories(os.environ.get("TOYRL_BREAK", ""))


@pytest.fixture
def wb_spec():
    return Path(__file__).parent / "weightbridge.yaml"


@pytest.fixture
def wb_trainer():
    return TRAINER


@pytest.fixture
def wb_rollout():
    return ROLLOUT
