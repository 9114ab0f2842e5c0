"""Run pytest in a subprocess, as an integrator would, and read back its junit XML and requirement report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "toy_integration"


@dataclass
class Outcome:
    returncode: int
    output: str
    cases: dict[str, dict]  # "Class::test" -> {"outcome", "message", "requirement"}
    report: dict[str, dict]  # requirement id -> plugin report entry ({} without --wb-report)

    def failed(self) -> set[str]:
        """Requirement ids whose test failed (or errored)."""
        return {r for r, v in self.report.items() if v["outcome"] in ("failed", "error")}


def run_pytest(args: list[str], tmp: Path, *, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout_s: float = 300) -> Outcome:
    junit, report = tmp / "junit.xml", tmp / "report.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           f"--wb-report={report}", *args]
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)
    out = proc.stdout + proc.stderr
    return Outcome(proc.returncode, out, _cases(junit) if junit.exists() else {},
                   json.loads(report.read_text())["requirements"] if report.exists() else {})


def _cases(path: Path) -> dict[str, dict]:
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome, message = kind, (el.get("message") or "") + "\n" + (el.text or "")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        name = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        cases[name] = {"outcome": outcome, "message": message, "requirement": props.get("requirement")}
    return cases
