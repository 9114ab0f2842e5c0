"""The requirement manifest: ids well formed, every requirement tested once, every test naming one."""

from __future__ import annotations

import inspect

import pytest

from weightbridge.testing import REQUIREMENTS, ConformanceSuite, coverage_problems, requirement
from weightbridge.testing.requirements import Requirement, check_known_gaps
from weightbridge.testing.scenarios import Runner


def suite_tests():
    return [(n, f) for n, f in inspect.getmembers(ConformanceSuite, inspect.isfunction) if n.startswith("test_")]


def test_every_requirement_has_exactly_one_test_and_every_test_names_a_requirement():
    assert coverage_problems(suite_tests()) == []
    assert len(suite_tests()) == len(REQUIREMENTS) == 22


def test_the_coverage_check_reports_both_directions():
    tests = suite_tests()
    untagged = lambda: None  # noqa: E731
    problems = coverage_problems([*tests[1:], ("test_untagged", untagged), tests[2]])
    dropped = tests[0][1].wb_requirement
    assert f"requirement {dropped} has no test" in problems
    assert "test test_untagged names no requirement (decorate it with @requirement(ID))" in problems
    assert any(p.startswith(f"requirement {tests[2][1].wb_requirement} has 2 tests") for p in problems)


def test_every_requirement_names_a_scenario_the_runner_has():
    for req in REQUIREMENTS.values():
        assert req.scenario == "parent" or hasattr(Runner, "_" + req.scenario.replace("-", "_")), req


def test_ids_and_behaviours_are_checked_when_declared():
    with pytest.raises(ValueError, match="is not area.subject.property"):
        Requirement(id="Sync.Push", behavior="x.", scenario="sync", hint="h")
    with pytest.raises(ValueError, match="one sentence ending with"):
        Requirement(id="sync.push.bitwise", behavior="no full stop", scenario="sync", hint="h")
    with pytest.raises(KeyError, match="unknown requirement id 'sync.push.sideways'"):
        requirement("sync.push.sideways")


def test_known_gaps_must_name_known_requirements_with_a_reason():
    assert check_known_gaps({"layout.rollout.probe-agrees": "no loader"}) == []
    problems = check_known_gaps({"layout.rollout.probe": "x", "sync.push.bitwise": " "})
    assert problems == [
        "known_gaps names unknown requirement 'layout.rollout.probe' (known: see weightbridge.testing.REQUIREMENTS)",
        "known_gaps['sync.push.bitwise'] needs a reason (a non-empty string)",
    ]
