"""Fixtures that describe the demo's reference integration to the conformance suite."""

import pytest

import wbconf_demo_sides


@pytest.fixture
def wb_spec(tmp_path_factory):
    from weightbridge.demo.model import write_demo_files

    return write_demo_files(tmp_path_factory.mktemp("demo-spec"), ("sync",), timeout_s=30.0)["sync"]


@pytest.fixture
def wb_trainer():
    return wbconf_demo_sides.DemoTrainerRank


@pytest.fixture
def wb_rollout():
    return wbconf_demo_sides.DemoRolloutRank
