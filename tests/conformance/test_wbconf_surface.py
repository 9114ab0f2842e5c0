"""``weightbridge.testing`` is the public conformance suite and nothing else: its ``__all__`` is exactly
the suite's surface, every name in it loads, and importing the package pulls in neither pytest nor
torch (a product path may import it without the test dependencies); harnesses are ``_internal``."""

from __future__ import annotations

import subprocess
import sys

import weightbridge.testing as wbt

SURFACE = ["ConformanceSuite", "REQUIREMENTS", "RankContext", "RankResult", "Requirement", "RolloutUnit",
           "TrainerRank", "coverage_problems", "launch", "requirement"]


def test_the_public_names_are_exactly_the_suite_and_all_load() -> None:
    assert wbt.__all__ == SURFACE
    for name in SURFACE:
        assert getattr(wbt, name) is not None, name
    assert set(SURFACE) <= set(dir(wbt))
    from weightbridge.localrun import launch

    assert wbt.launch is launch
    assert wbt.ConformanceSuite.__module__ == "weightbridge.testing.suite"
    # No harness under a public name (they live in weightbridge.testing._internal).
    public = {m.name for m in __import__("pkgutil").iter_modules(wbt.__path__)}
    assert public == {"_internal", "contract", "plugin", "ranks", "requirements", "scenarios", "suite", "verdict"}


def test_importing_the_package_imports_neither_pytest_nor_torch() -> None:
    code = ("import sys, weightbridge.testing as t\n"
            "loaded = sorted(m for m in ('pytest', '_pytest', 'torch') if m in sys.modules)\n"
            "assert not loaded, loaded\n"
            "t.REQUIREMENTS; t.RankContext; t.launch\n"
            "assert 'pytest' not in sys.modules, 'a name other than ConformanceSuite imported pytest'\n"
            "t.ConformanceSuite\n"
            "assert 'pytest' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
