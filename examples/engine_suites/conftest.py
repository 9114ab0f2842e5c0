"""What the three engine suites share (the contract: ``help(weightbridge.testing)``): each suite's spec
is the ``weightbridge.yaml`` beside its test module, and its rollout factory builds one engine per
rollout instance (scope ``"instance"``). Each directory's ``conftest.py`` names its sides."""

from pathlib import Path

import pytest


@pytest.fixture
def wb_spec(request):
    return Path(request.node.path).parent / "weightbridge.yaml"


@pytest.fixture
def wb_rollout_scope():
    return "instance"
