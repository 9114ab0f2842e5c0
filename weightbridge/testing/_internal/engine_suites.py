"""Run a shipped engine suite (``examples/engine_suites/NAME``, e.g. ``vllm_suite``) as a wheel user runs it.

``weightbridge examples engine_suites --copy DIR`` into an empty directory, then
``python -m pytest -q engine_suites/NAME --wb-report=...`` there, in a fresh interpreter: the suite
sees only the shipped files and the installed package. Used by weightbridge's own tests
(``tests/conformance/vllm_suite``, ``tests/conformance/sglang_suite``, ``tests/megatron_trainer``).

``WB_SHIPPED_SUITE_PYTHON`` (CI sets it): the interpreter of an environment with the built wheel
installed (non-editable) and the engine; the suite then runs there with no ``PYTHONPATH``, and a
``weightbridge`` that is not an installed distribution's (a checkout) fails the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SuiteRun:
    returncode: int
    output: str
    report: dict[str, dict]  # requirement id -> the plugin's report entry ({"outcome", ...})

    def outcomes(self) -> dict[str, str]:
        return {req: entry["outcome"] for req, entry in self.report.items()}

    def check(self, expected: dict[str, str]) -> None:
        """Raise ``AssertionError`` unless the run exited 0 with exactly ``expected`` (requirement id ->
        outcome), naming what differs, with the run's output tail."""
        got = self.outcomes()
        if self.returncode == 0 and got == expected:
            return
        differ = {r: (got.get(r), expected.get(r)) for r in sorted(set(got) | set(expected))
                  if got.get(r) != expected.get(r)}
        raise AssertionError(f"suite exit {self.returncode}; outcomes (got, expected) that differ: {differ}\n"
                             f"{self.output[-6000:]}")


def run_shipped_suite(name: str, workdir: Path, *, timeout_s: float, env: dict[str, str] | None = None) -> SuiteRun:
    """Copy the shipped engine suites into ``workdir`` (empty) and run suite ``name`` there."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, **(env or {})}
    python = os.environ.get("WB_SHIPPED_SUITE_PYTHON") or sys.executable
    if python != sys.executable:  # a wheel user's environment: nothing of this checkout on the path
        run_env.pop("PYTHONPATH", None)
        where = subprocess.run([python, "-c", "import weightbridge; print(weightbridge.__file__)"], cwd=workdir,
                               capture_output=True, text=True, timeout=120, env=run_env)
        origin = where.stdout.strip()
        if where.returncode != 0 or "site-packages" not in Path(origin).parts:
            return SuiteRun(1, f"WB_SHIPPED_SUITE_PYTHON={python} imports weightbridge from {origin or '?'}, "
                            f"not from an installed wheel\n{where.stderr[-2000:]}", {})
    copy = subprocess.run([python, "-m", "weightbridge", "examples", "engine_suites", "--copy", str(workdir)],
                          capture_output=True, text=True, timeout=120, env=run_env)
    if copy.returncode != 0:
        return SuiteRun(copy.returncode, copy.stdout + copy.stderr, {})
    report = workdir / f"{name}-report.json"
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--wb-report={report}",
                           f"engine_suites/{name}"], cwd=workdir, capture_output=True, text=True, timeout=timeout_s,
                          env=run_env)
    got = json.loads(report.read_text())["requirements"] if report.exists() else {}
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, got)
