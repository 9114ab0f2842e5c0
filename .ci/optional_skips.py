"""pytest plugin for .ci/run: record the tests that skipped because an optional extra is missing.

Phase 1 runs the whole suite in a venv with only ``.[dev]`` and writes the node ids of every test
or module that skipped with weightbridge's install hint (``pip install 'weightbridge-rl[EXTRA]'``,
see ``weightbridge/testing/_internal/optional.py``) to ``$WB_CI_SKIPS``. Phase 2 installs the extras and runs
exactly those ids with ``WEIGHTBRIDGE_REQUIRE_*=1``: every test runs once, and none that needs an
extra can skip in both phases. Loaded with ``-p optional_skips`` and ``.ci`` on ``PYTHONPATH``.
The file is appended to (also by pytest-xdist workers): empty it first, ``sort -u`` it after.
"""

from __future__ import annotations

import os

HINT = "pip install 'weightbridge-rl["
_ids: list[str] = []


def _record(report) -> None:  # noqa: ANN001 - pytest report objects
    if report.skipped and HINT in str(report.longrepr) and report.nodeid not in _ids:
        _ids.append(report.nodeid)


def pytest_collectreport(report) -> None:  # noqa: ANN001 - a module-level skip (require() at import)
    _record(report)


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001 - a skip inside a test or fixture
    _record(report)


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001, ARG001
    # Appended, by every process: under pytest-xdist each worker records what it collected and
    # ran (the controller gets one report per distinct skip reason at collection, so modules that
    # skip for the same reason would be lost). The caller empties the file first and dedups it.
    path = os.environ.get("WB_CI_SKIPS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(i + "\n" for i in _ids))
