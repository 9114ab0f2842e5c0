"""Fixtures of the Megatron-Core trainer's conformance run (test_wbconf_megatron.py)."""

import pytest


@pytest.fixture
def wb_spec(tmp_path_factory):
    import wbconf_megatron_sides

    return wbconf_megatron_sides.write_spec(tmp_path_factory.mktemp("megatron-spec"))


@pytest.fixture
def wb_trainer():
    import wbconf_megatron_sides

    return wbconf_megatron_sides.MegatronTrainer


@pytest.fixture
def wb_rollout():
    import wbconf_megatron_sides

    return wbconf_megatron_sides.StandInRolloutRank
