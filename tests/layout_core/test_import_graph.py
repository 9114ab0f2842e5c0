"""The import graph of weightbridge/ and mcp_server/ (every import statement, lazy and ``TYPE_CHECKING`` ones
included): no cycles, layers kept, lazy where promised."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import weightbridge

ROOT = Path(weightbridge.__file__).resolve().parent.parent
PACKAGES = ("weightbridge", "mcp_server")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return [mod] + [f"{mod}.{a.name}" for a in node.names]  # `from pkg import submodule` imports it


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement: module level, inside functions (lazy) and under ``TYPE_CHECKING``."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in _all_imports(ast.parse(path.read_text())):
            deps.update(t for t in _targets(name, path, node) if t in mods and t != name)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """Imports of every kind (module level, function level, ``TYPE_CHECKING``) of weightbridge and mcp_server
    form no cycle: a lazy or annotation-only import is still a dependency, and a cycle through one means two
    modules that cannot be understood (or moved) apart."""
    assert _cycles(_graph()) == []


def test_mcp_server_imports_no_cli_internals() -> None:
    """The MCP server and the CLI are peers: what both need lives in ``weightbridge.ops`` (any import, lazy ones too)."""
    offenders = []
    for name, path in _modules().items():
        if not name.startswith("mcp_server"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(name, path, node):
                    if t == "weightbridge.cli" or t.startswith("weightbridge.cli."):
                        offenders.append(f"{name}:{node.lineno} imports {t}")
    assert offenders == []


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)


def test_transport_package_imports_lazily() -> None:
    """``import weightbridge.transport`` (and its errors) loads no torch at all, so no ``torch.distributed``."""
    proc = _run(
        "import sys\n"
        "import weightbridge.transport, weightbridge.transport.errors\n"
        "from weightbridge.transport import PeerTimeout\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
        " or m.startswith('weightbridge.transport.') and m != 'weightbridge.transport.errors')\n"
        "assert 'Executor' in weightbridge.transport.__all__\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_probe_loads_no_data_plane(tmp_path: Path) -> None:
    """``weightbridge probe`` end to end loads none of the data plane (group, executor, store) nor the runtime.

    (``import torch`` itself imports the ``torch.distributed`` package, so the check is on weightbridge's
    modules that use it.)
    """
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2, mesh: {dp: 2}}\n"
                    "rollout: {preset: vllm, mesh: {tp: 2}}\n")
    out = tmp_path / "probe.json"
    proc = _run(
        "import sys\n"
        "from weightbridge.cli.main import main\n"
        f"rc = main(['probe', {str(spec)!r}, '--loader', 'tests.probe._zoo:vllm_factory', '--rank', '1',"
        f" '-o', {str(out)!r}, '--check'])\n"
        "assert rc == 0, rc\n"
        "import weightbridge.transport\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('weightbridge.transport.', 'weightbridge.runtime',"
        " 'weightbridge.sync', 'weightbridge.bridge')))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.is_file()


def test_ops_import_no_torch() -> None:
    """``weightbridge.ops`` (shared by the CLI and the MCP server) is as pure as spec/ and plan/."""
    proc = _run(
        "import sys\n"
        "import weightbridge.ops.planning, weightbridge.ops.draft, weightbridge.ops.models\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
