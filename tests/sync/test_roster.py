"""The roster: the one translation between spec, plan and bridge ranks."""

from __future__ import annotations

import pytest

from weightbridge.spec.resolve import check_text
from weightbridge.sync.messages import Membership
from weightbridge.sync.roster import RankId, Roster

from sync_harness import spec_text


@pytest.fixture(scope="module")
def resolved():
    r, problems = check_text(spec_text(rollout="{preset: vllm, instances: 3, mesh: {tp: 2}}"))
    assert not problems
    return r


def test_a_roster_without_instance_0_renumbers_plan_and_bridge_ranks(resolved):
    ro = Roster.of_instances(resolved.rollout, 2, (1, 2), epoch=4)
    assert ro.rollout_ranks == (2, 3, 4, 5) and ro.world_size == 6
    assert ro.plan_rank(RankId("rollout", 2)) == 0 and ro.bridge_rank(RankId("rollout", 2)) == 2
    assert ro.plan_rank(RankId("trainer", 1)) == 1 and ro.bridge_rank(RankId("trainer", 1)) == 1
    assert ro.spec_of_bridge(5) == RankId("rollout", 5) and ro.spec_of_plan("rollout", 1) == RankId("rollout", 3)
    assert ro.bridge_of_plan("rollout", 3) == 5 and ro.plan_of_bridge(3) == ("rollout", 1)
    assert ro.describe(2) == "rollout 2 (bridge rank 2)" and ro.describe(9) == "bridge rank 9"
    trainers, rollouts = (RankId("trainer", t) for t in range(2)), (RankId("rollout", r) for r in range(2, 6))
    assert ro.members == (*trainers, *rollouts)
    assert RankId("rollout", 1) not in ro and RankId("rollout", 4) in ro and RankId("trainer", 2) not in ro
    with pytest.raises(ValueError, match="rollout 0 is not a member of epoch 4"):
        ro.plan_rank(RankId("rollout", 0))
    layout = ro.rollout_layout(resolved.rollout)
    assert [(r.rank, r.instance, r.local_rank) for r in layout.ranks] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert layout.num_instances == 2


def test_every_instance_keeps_the_spec_layout_and_membership_round_trips(resolved):
    ro = Roster.of_instances(resolved.rollout, 2, (0, 1, 2), epoch=1)
    assert ro.rollout_layout(resolved.rollout) is resolved.rollout
    m = Membership(epoch=1, num_trainers=2, instances=ro.instances, rollout_ranks=ro.rollout_ranks, reason="x")
    assert Roster.of_membership(m) == ro


def test_the_identity_roster_numbers_like_the_plan():
    ro = Roster.identity(2, 3)
    assert [ro.describe(b) for b in range(5)] == [
        "trainer 0 (bridge rank 0)", "trainer 1 (bridge rank 1)", "rollout 0 (bridge rank 2)",
        "rollout 1 (bridge rank 3)", "rollout 2 (bridge rank 4)",
    ]
