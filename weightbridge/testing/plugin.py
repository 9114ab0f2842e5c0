"""pytest plugin of the conformance suite (entry point ``pytest11: weightbridge``).

Inert unless a test class derives from :class:`weightbridge.testing.ConformanceSuite`: no autouse
fixtures, no imports beyond the standard library and pytest at load time. It

* marks each suite test with its requirement (``user_properties`` -> junit XML
  ``<property name="requirement">``) and turns ``known_gaps`` into strict xfail marks;
* prints a requirement summary at the end and, with ``--wb-report PATH``, writes it as JSON:
  ``{"requirements": {ID: {"outcome": "passed|failed|xfailed|error|...", "test": NODEID,
  "message": FIRST_LINE}}}``.
"""

from __future__ import annotations

import json

import pytest

_RESULTS: dict[str, dict] = {}


def pytest_addoption(parser):
    group = parser.getgroup("weightbridge", "weightbridge conformance suite")
    group.addoption("--wb-report", metavar="PATH", default=None,
                    help="write the conformance outcome of every requirement as JSON to PATH")


def _requirement(item) -> str | None:
    return getattr(getattr(item, "function", None), "wb_requirement", None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        req = _requirement(item)
        if req is None:
            continue
        item.user_properties.append(("requirement", req))
        gaps = getattr(item.cls, "known_gaps", None) or {}
        if gaps:
            from weightbridge.testing.requirements import check_known_gaps

            problems = check_known_gaps(gaps)
            if problems:
                raise pytest.UsageError(f"{item.cls.__name__}.known_gaps: " + "; ".join(problems))
        if req in gaps:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"known gap {req}: {gaps[req]}"))


def pytest_runtest_logreport(report):
    req = dict(report.user_properties).get("requirement")
    if req is None:
        return
    if report.when == "call" or report.outcome != "passed":
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when != "call" and report.failed:
            outcome = "error"
        else:
            outcome = report.outcome
        message = ""
        if report.failed or hasattr(report, "wasxfail"):
            text = str(report.longrepr) if report.longrepr else getattr(report, "wasxfail", "")
            message = text.strip().splitlines()[0] if text.strip() else ""
        prev = _RESULTS.get(req)
        if prev is None or prev["outcome"] == "passed":
            _RESULTS[req] = {"outcome": outcome, "test": report.nodeid, "message": message}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _RESULTS:
        return
    tr = terminalreporter
    tr.section("weightbridge conformance")
    by: dict[str, list[str]] = {}
    for req, res in sorted(_RESULTS.items()):
        by.setdefault(res["outcome"], []).append(req)
    for outcome in ("failed", "error", "xpassed", "xfailed", "passed"):
        if by.get(outcome):
            tr.write_line(f"{outcome:8} {len(by[outcome]):3}  {', '.join(by[outcome])}")
    path = config.getoption("--wb-report")
    if path:
        with open(path, "w") as f:
            json.dump({"requirements": _RESULTS}, f, indent=1, sort_keys=True)
        tr.write_line(f"requirement report written to {path}")
