"""Fail a CI phase that could see a weightbridge other than its own environment's (run by .ci/run).

    VENV/bin/python .ci/env_guard.py --venv VENV --expect DIR

run with the phase's environment as a user has it (``VENV/bin`` first on ``PATH``). ``DIR`` is where
the phase's ``weightbridge`` package must come from: the checkout for an editable install, the
venv's site-packages for the wheel. A problem is reported (exit 1) when

* a ``weightbridge`` or ``weightbridge-mcp`` executable on ``PATH`` lies outside ``VENV/bin`` (the
  system interpreter's script once made phase 1 pass only on machines where phase 2 had run);
* ``VENV/bin/python``, started from an empty directory with this environment, imports
  ``weightbridge`` (or ``mcp_server``) from anywhere but ``DIR``;
* a directory on that interpreter's ``sys.path`` outside ``VENV`` and ``DIR`` holds a ``weightbridge``
  package or distribution (``PYTHONPATH``, a ``.pth`` file, system site-packages).

Standard library only: it runs before anything is known about the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = ("weightbridge", "weightbridge-mcp")
PACKAGES = ("weightbridge", "mcp_server")

PROBE = r"""
import importlib.util, json, sys
found = {}
for name in %r:
    spec = importlib.util.find_spec(name)
    found[name] = spec.origin if spec is not None else None
print(json.dumps({"found": found, "sys_path": sys.path, "prefix": sys.prefix}))
""" % (PACKAGES,)


def _inside(path: str | Path, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def foreign_scripts(path_env: str, venv: Path) -> list[str]:
    """Every ``weightbridge`` executable on ``path_env`` that is not ``venv``'s own."""
    out = []
    for entry in path_env.split(os.pathsep):
        for name in SCRIPTS:
            exe = Path(entry or ".") / name
            if exe.is_file() and os.access(exe, os.X_OK) and not _inside(exe.parent, venv / "bin"):
                out.append(f"{exe}: a {name} outside this phase's environment ({venv}) is on PATH")
    return out


def probe(python: Path, env: dict[str, str]) -> dict:
    """What ``python`` imports, and its ``sys.path``, started from an empty directory with ``env``."""
    with tempfile.TemporaryDirectory(prefix="wb-guard-") as cwd:
        proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not be probed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _holds_weightbridge(entry: Path) -> bool:
    return (entry / "weightbridge" / "__init__.py").is_file() or any(entry.glob("weightbridge_rl-*.dist-info"))


def foreign_imports(report: dict, venv: Path, expect: Path) -> list[str]:
    """Problems in a :func:`probe` report: a package from outside ``expect``, a foreign ``sys.path`` entry."""
    out = []
    if not _inside(report["prefix"], venv):
        out.append(f"the interpreter's prefix {report['prefix']} is not the phase's environment {venv}")
    origin = report["found"].get("weightbridge")
    if origin is None:
        out.append(f"weightbridge is not importable in {venv}")
    for name, where in report["found"].items():
        if where is not None and not _inside(where, expect):
            out.append(f"{name} is imported from {where}, not from {expect}")
    for entry in report["sys_path"]:
        if not entry or _inside(entry, venv) or _inside(entry, expect):
            continue
        if Path(entry).is_dir() and _holds_weightbridge(Path(entry)):
            out.append(f"{entry} (on sys.path, outside {venv}) holds a weightbridge")
    return out


def check(venv: Path, expect: Path, env: dict[str, str]) -> list[str]:
    problems = foreign_scripts(env.get("PATH", ""), venv)
    problems += foreign_imports(probe(venv / "bin" / "python", env), venv, expect)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--venv", type=Path, required=True, help="the phase's environment")
    p.add_argument("--expect", type=Path, required=True, help="where its weightbridge package must come from")
    args = p.parse_args(argv)
    problems = check(args.venv, args.expect, dict(os.environ))
    for line in problems:
        print(f"[env-guard] {line}", file=sys.stderr)
    if problems:
        print(f"[env-guard] FAILED: this phase could run a weightbridge that is not {args.expect}", file=sys.stderr)
        return 1
    print(f"[env-guard] ok: only {args.venv}'s weightbridge ({args.expect}) is visible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
