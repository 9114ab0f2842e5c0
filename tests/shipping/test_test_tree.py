"""No test directory may shadow a package, and optional packages are never mistaken for a directory.

pytest's default "prepend" import mode puts on ``sys.path`` the first directory above each test
module (and conftest) that has no ``__init__.py``, and ``python -m pytest`` adds the repository
root. Any directory there named like an optional dependency (``tests/vllm/``) then imports as an
empty namespace package when the dependency is missing, so ``import vllm`` "succeeds" and the
vLLM tests run instead of skipping. Two guards: the tree has no such names (checked here for
every known optional dependency and every installed distribution), and
:func:`weightbridge.testing._internal.optional.require` treats a namespace package as absent.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import env_name, find_real, require

REPO = Path(__file__).resolve().parents[2]

# Optional dependencies of weightbridge and of the integrations it tests or documents, by import
# name, whether or not this environment has them.
OPTIONAL = {"vllm", "mcp", "sglang", "megatron", "ray", "matplotlib", "hypothesis", "pytest", "torch",
            "transformers", "safetensors", "yaml", "pydantic", "jsonschema", "rich", "packaging", "numpy",
            "psutil", "build", "setuptools", "verl", "openrlhf", "slime", "trl", "torchtitan", "flashinfer"}
OURS = {"weightbridge", "mcp_server", "toyrl"}


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return [p for p in REPO.rglob("*") if ".git" not in p.parts]
    return [REPO / line for line in out.splitlines() if line]


def _sys_path_dirs(files: list[Path]) -> set[Path]:
    """The directories pytest (prepend mode) and ``python -m pytest`` put on sys.path."""
    dirs = {REPO}
    for f in files:
        if f.suffix == ".py" and (f.name.startswith("test_") or f.name == "conftest.py"):
            d = f.parent
            while (d / "__init__.py").exists():
                d = d.parent
            dirs.add(d)
    return dirs


def _importable_names(directory: Path, files: list[Path]) -> dict[str, Path]:
    """Top-level import names that ``directory`` offers (its subdirectories and .py modules)."""
    out = {}
    for f in files:
        try:
            rel = f.relative_to(directory)
        except ValueError:
            continue
        first = rel.parts[0]
        name = first[:-3] if len(rel.parts) == 1 and first.endswith(".py") else first if len(rel.parts) > 1 else None
        if name and name.isidentifier():
            out[name] = directory / first
    return out


def test_no_directory_on_the_test_path_shadows_a_package() -> None:
    protected = OPTIONAL | set(importlib.metadata.packages_distributions())
    files = _tracked()
    clashes = []
    for d in sorted(_sys_path_dirs(files)):
        for name, where in _importable_names(d, files).items():
            if name in protected and not (d == REPO and name in OURS):
                clashes.append(f"{where.relative_to(REPO)} shadows the package {name!r}")
    assert clashes == [], "rename these (e.g. tests/vllm -> tests/vllm_engine):\n" + "\n".join(clashes)


def test_require_treats_a_same_named_directory_as_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wbshadowpkg").mkdir()  # what tests/vllm/ was: a directory without __init__.py
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(env_name("wbshadowpkg"), raising=False)
    import wbshadowpkg  # noqa: F401 - the trap: a plain import succeeds

    assert "same-named directory" in (find_real("wbshadowpkg") or "")
    with pytest.raises(pytest.skip.Exception, match=r"wbshadowpkg is not installed .*weightbridge-rl\[demo-extra\]"):
        require("wbshadowpkg", extra="demo-extra")
    monkeypatch.setenv("WEIGHTBRIDGE_REQUIRE_WBSHADOWPKG", "1")
    with pytest.raises(ImportError, match="WEIGHTBRIDGE_REQUIRE_WBSHADOWPKG=1 but"):
        require("wbshadowpkg", extra="demo-extra")


def test_require_returns_the_real_package() -> None:
    assert require("json", extra="none") is sys.modules["json"]
    assert find_real("wb_no_such_package_here") == "wb_no_such_package_here is not installed"
