"""The out-of-tree sample integration (examples/toy_integration) through the plugin, as its author runs it:
the real integration passes every requirement; each documented breakage is caught by its own requirement."""

from __future__ import annotations

import pytest
from wbconf_pytest import EXAMPLE, REPO, run_pytest

from weightbridge.testing import REQUIREMENTS

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

# breakage -> (tests to run: -k, requirement ids that must fail among them, text the failure must show)
BREAKAGES = {
    "fused-order": ("probing_the_rollout or rollout_tensors", {"layout.rollout.probe-agrees"},
                    "engine.layers.0.w13: pieces differ"),
    "lagging-version": ("sync_pushes or increase or visible", {"sync.version.visible"},
                        "apply() returned 2 but .version then read 1"),
    "swallow-errors": ("dead_sender or interrupted or heals", {"fault.sender-dies.typed-error"},
                       "no error reported after trainer 1 died"),
    "retry-on-deadline": ("nobody_receives", {"fault.no-receiver.deadline"}, "the bound is 5.0s"),
    "torn-hidden": ("dead_sender or interrupted or heals", {"fault.torn-state.safe"},
                    "neither torn nor at any version"),
    "give-up-after-error": ("recovers_after", {"async.failed-push.heals"},
                            "push(4) after the failed push(3) raised DeadlineExceeded"),
    "hard-coded-secret": ("without_the_job_secret", {"auth.unauthenticated-sender.refused"},
                          "applied version 9, pushed by trainers without the job secret"),
}


def test_the_sample_integration_passes_every_requirement(tmp_path):
    out = run_pytest([str(EXAMPLE)], tmp_path)
    assert out.returncode == 0, out.output[-4000:]
    assert {r: v["outcome"] for r, v in out.report.items()} == {r: "passed" for r in REQUIREMENTS}


def test_the_documented_breakages_are_the_ones_tested_here():
    import sys

    sys.path.insert(0, str(EXAMPLE))
    try:
        from toyrl.conformance import BREAKAGES as documented
    finally:
        sys.path.remove(str(EXAMPLE))
    assert {name: req for name, (_, _, req) in documented.items()} == {
        name: next(iter(ids)) for name, (_, ids, _) in BREAKAGES.items()}
    assert len({next(iter(ids)) for _, ids, _ in BREAKAGES.values()}) == 7  # seven different requirements


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_each_breakage_fails_exactly_its_requirement_with_an_actionable_message(breakage, tmp_path):
    select, want, text = BREAKAGES[breakage]
    out = run_pytest([str(EXAMPLE), "-k", select], tmp_path, env={"TOYRL_BREAK": breakage})
    assert out.returncode == 1, out.output[-4000:]
    assert out.failed() == want, out.output[-4000:]
    (req,) = want
    failure = next(c["message"] for c in out.cases.values() if c["requirement"] == req)
    assert text in failure, failure
    assert f"hint: {REQUIREMENTS[req].hint}" in failure
    assert all(v["outcome"] == "passed" for r, v in out.report.items() if r not in want)
    assert str(REPO) in out.report[req]["test"] or out.report[req]["test"].startswith("examples/")
