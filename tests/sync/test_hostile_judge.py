"""The hostile pass's judge (:func:`weightbridge.testing._internal.hostile.judge_job`) on hand-made event logs.

The forge step is judged on when each rollout *began* ``apply()``: the genuine ack is written inside
``apply()``, so a push may return while the last rollout is still recording its apply (a judge that
used the end of ``apply()`` called that early: the soak flaked with "0.00s before every rollout
applied it"); only forged acks let a push return before the last rollout even began.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from weightbridge.testing._internal import hostile as H

STEP = {"step": 0, "action": "forge", "label": "ack(*)", "kind": "forged-acks", "versions": (2, 3)}


def _ok(events):
    return SimpleNamespace(ok=True, value=events, timed_out=False, exitcode=0)


def _job(pushed_at: float, began: float, ended: float) -> list:
    trainers = [_ok([{"kind": "pushed", "v": 2, "t": pushed_at}, {"kind": "pushed", "v": 3, "t": 20.0}])
                for _ in range(2)]
    rollouts = [_ok([{"kind": "applied", "v": 2, "before": 1, "bad": [], "t": ended, "began": began},
                     {"kind": "applied", "v": 3, "before": 2, "bad": [], "t": 21.0, "began": 20.5}])
                for _ in range(2)]
    return [*trainers, *rollouts, _ok([])]  # then the stranger's events


@pytest.mark.parametrize(("pushed_at", "early"), [
    (10.2, False),  # genuine: after the rollouts began apply(), before they recorded its end
    (11.5, False),  # after apply() ended
    (8.0, True),    # forged acks: before any rollout began
])
def test_the_forge_step_is_early_only_when_a_push_returns_before_the_rollouts_began_applying(pushed_at, early):
    (row,) = H.judge_job([dict(STEP)], "sync", _job(pushed_at, began=10.0, ended=11.0))
    assert bool(row["early"]) is early, row["early"]
    assert row["next_ok"] and row["healed"]
    if early:
        assert row["early"][0] == "trainer/0: push(2) returned, 2.00s before every rollout began applying it"
