"""The CI guard (.ci/env_guard.py) fails a phase that could see a weightbridge outside its own environment
(issue 26: phase 1 passed only because phase 2 had put weightbridge into the system interpreter, whose
script stayed on PATH). Checked against a real interpreter in a throwaway venv."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("wb_ci_env_guard", REPO / ".ci" / "env_guard.py")
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _package(root: Path) -> Path:
    (root / "weightbridge").mkdir(parents=True)
    (root / "weightbridge" / "__init__.py").write_text("")
    return root


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv (no pip, no site-packages from outside) with its own weightbridge script."""
    path = tmp_path_factory.mktemp("guard") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    _script(path / "bin" / "weightbridge")
    return path


def _env(venv: Path, path_dirs: list[Path], pythonpath: list[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *map(str, path_dirs), "/usr/bin", "/bin"])
    env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return env


def test_only_the_phase_s_own_weightbridge_passes(venv: Path, tmp_path: Path) -> None:
    expect = _package(tmp_path / "checkout")
    assert guard.check(venv, expect, _env(venv, [], [expect])) == []


def test_a_foreign_script_on_path_fails_even_behind_the_venv(venv: Path, tmp_path: Path) -> None:
    expect = _package(tmp_path / "checkout")
    system_bin = _script(tmp_path / "system" / "bin" / "weightbridge").parent
    _script(system_bin / "weightbridge-mcp")
    problems = guard.check(venv, expect, _env(venv, [system_bin], [expect]))
    assert problems == [f"{system_bin / name}: a {name} outside this phase's environment ({venv}) is on PATH"
                        for name in ("weightbridge", "weightbridge-mcp")]


def test_a_foreign_package_on_sys_path_fails(venv: Path, tmp_path: Path) -> None:
    expect = _package(tmp_path / "checkout")
    other = _package(tmp_path / "other")
    problems = guard.check(venv, expect, _env(venv, [], [other, expect]))
    assert problems == [f"weightbridge is imported from {other / 'weightbridge' / '__init__.py'}, not from {expect}",
                        f"{other} (on sys.path, outside {venv}) holds a weightbridge"]
    # Shadowed by the expected one, it is still visible: a subprocess with another cwd could pick it up.
    assert guard.check(venv, expect, _env(venv, [], [expect, other])) == [
        f"{other} (on sys.path, outside {venv}) holds a weightbridge"]


def test_the_script_exits_1_naming_the_problem(venv: Path, tmp_path: Path) -> None:
    expect = _package(tmp_path / "checkout")
    env = _env(venv, [_script(tmp_path / "usr" / "bin" / "weightbridge").parent], [expect])
    proc = subprocess.run([str(venv / "bin" / "python"), str(REPO / ".ci" / "env_guard.py"), "--venv", str(venv),
                           "--expect", str(expect)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "usr/bin/weightbridge: a weightbridge outside" in proc.stderr
    assert "FAILED" in proc.stderr
    env = _env(venv, [], [expect])
    proc = subprocess.run([str(venv / "bin" / "python"), str(REPO / ".ci" / "env_guard.py"), "--venv", str(venv),
                           "--expect", str(expect)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "[env-guard] ok" in proc.stdout, proc.stderr
