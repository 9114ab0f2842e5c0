"""Turning scenario events into pass/fail with actionable messages (used by the suite's tests)."""

from __future__ import annotations

from typing import Any

from weightbridge.testing.requirements import REQUIREMENTS
from weightbridge.testing.scenarios import ScenarioRun


class Verdict:
    """Collects problems for one requirement; :meth:`done` fails the test listing all of them."""

    def __init__(self, req_id: str, run: ScenarioRun | None = None) -> None:
        self.req = REQUIREMENTS[req_id]
        self.run = run
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def expect(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.add(problem)
        return ok

    def processes_ok(self, *, allow: tuple[str, ...] = ()) -> bool:
        """Every process of the run finished normally (those in ``allow`` may have died)."""
        if self.run is None:
            raise RuntimeError("processes_ok() before the scenario ran (no run recorded)")
        for p in self.run.broken(allow=allow):
            self.add(p)
        return not self.problems

    def done(self) -> None:
        if not self.problems:
            return
        import pytest

        lines = [f"{self.req.id}: {self.req.behavior}"]
        lines += [f"  - {p}" for p in self.problems[:12]]
        if len(self.problems) > 12:
            lines.append(f"  ... and {len(self.problems) - 12} more")
        lines.append(f"  hint: {self.req.hint}")
        if self.run is not None:
            lines.append(f"  scenario {self.run.name!r} ({self.run.wall_s:.1f}s), spec {self.run.spec_path}")
        pytest.fail("\n".join(lines), pytrace=False)


def first_bad(bad: dict[Any, list[str]] | None) -> str:
    """The first mismatch of a per-rank mismatch map, or '' when all ranks matched."""
    for rank, problems in (bad or {}).items():
        if problems:
            return f"rank {rank}: {len(problems)}+ piece(s) differ, e.g. {problems[0]}"
    return ""


def typed_error_in_time(v: Verdict, proc, since: float, limit_s: float, what: str, version: int | None = None) -> None:
    """``proc`` reported a typed BridgeError at most ``limit_s`` after ``since``."""
    errors = [e for e in proc.of("error") if version is None or e.get("version") == version]
    if not errors:
        v.add(f"{proc.label}: no error reported after {what} (an error was swallowed, or the call returned normally)")
        return
    e = errors[0]
    v.expect(e["typed"], f"{proc.label}: raised {e['type']} (not a weightbridge BridgeError): {e['message'][:200]}")
    late = e["time"] - since
    v.expect(late <= limit_s, f"{proc.label}: the error came {late:.1f}s after {what}; the bound is {limit_s:.1f}s")
