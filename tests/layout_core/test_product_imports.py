"""Product code runs without pytest and imports no test harness (issue 27: a wheel with no extras ran
``weightbridge demo`` into "No module named 'pytest'", through a harness the demo imported).

Product modules: every module of ``weightbridge/`` and ``mcp_server/`` except the public conformance
suite's pytest parts (``weightbridge.testing.plugin`` and ``.suite``) and the harnesses
(``weightbridge.testing._internal``). They are imported in a fresh interpreter whose import system
refuses ``pytest``; a module whose optional engine or SDK (an extra) is not installed here may fail
for that reason only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import weightbridge

ROOT = Path(weightbridge.__file__).resolve().parent.parent
PYTEST_ONLY = {"weightbridge.testing.plugin", "weightbridge.testing.suite"}
HARNESSES = "weightbridge.testing._internal"
# What the extras install (pyproject's optional dependencies), by top-level import name.
EXTRA_PACKAGES = {"vllm", "sglang", "megatron", "mcp", "ray", "sgl_kernel"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> list[str]:
    out = []
    for pkg in ("weightbridge", "mcp_server"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            name = _module_name(p)
            if name.endswith("__main__") or name in PYTEST_ONLY or name == HARNESSES or name.startswith(HARNESSES + "."):
                continue
            out.append(name)
    return out


CHILD = r"""
import importlib, importlib.util, json, sys

class RefusePytest:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest"):
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
        return None

for mod in [m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest")]:
    del sys.modules[mod]
sys.meta_path.insert(0, RefusePytest())
try:
    import pytest  # noqa: F401
    sys.exit("the finder did not refuse pytest")
except ModuleNotFoundError:
    pass
modules, extras = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
failed, missing_extra = {}, {}
for name in modules:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in extras and importlib.util.find_spec(top) is None:
            missing_extra[name] = top
        else:
            failed[name] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported
        failed[name] = f"{type(exc).__name__}: {exc}"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest"))
print(json.dumps({"failed": failed, "missing_extra": missing_extra, "pytest_loaded": loaded}))
"""


def test_every_product_module_imports_with_pytest_refused() -> None:
    modules = product_modules()
    assert "weightbridge.demo.run" in modules and "weightbridge.localrun" in modules and "mcp_server.server" in modules
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(modules), json.dumps(sorted(EXTRA_PACKAGES))],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}, report["failed"]
    assert report["pytest_loaded"] == []
    # Only integrations of engines/SDKs that are not installed here may be left out, never the core.
    assert all(m.startswith(("weightbridge.integrations.", "mcp_server")) for m in report["missing_extra"]), report


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level, in functions or under ``TYPE_CHECKING``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_product_module_imports_a_harness() -> None:
    """Product code (everything but weightbridge/testing/) imports nothing from weightbridge.testing, and
    the public suite nothing from its harnesses; every import kind counts (function-level ones too)."""
    bad = []
    for pkg in ("weightbridge", "mcp_server"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            name = _module_name(p)
            if name.startswith(HARNESSES):
                continue
            forbidden = HARNESSES if name.startswith("weightbridge.testing") else "weightbridge.testing"
            bad += [f"{name} imports {m}" for m in sorted(_imported_modules(p))
                    if m == forbidden or m.startswith(forbidden + ".")]
    assert bad == []


def test_the_harness_check_sees_function_level_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from weightbridge.testing._internal.soak import job_cfg\n"
                   "    import weightbridge.testing.suite\n")
    assert {"weightbridge.testing._internal.soak", "weightbridge.testing.suite"} <= _imported_modules(src)
