"""The server writes only inside its roots: temporary files, caches, the subprocesses' too.

A stdio server whose ``HOME`` and ``TMPDIR`` are empty directories outside its root (no
``XDG_CACHE_HOME``, no ``WEIGHTBRIDGE_CACHE_DIR``) inspects a model from a ``config.json`` (the
canonical cache is written), validates and plans a spec, probes a loader (a ``weightbridge probe``
subprocess) and runs a test module that uses ``tmp_path`` (a pytest subprocess). Afterwards both
outside directories are still empty; the cache sits in the state directory inside the root, whose
per-call directories are gone.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client, StdioServerParameters  # noqa: E402 - after the skip above
from mcp_helpers import ROOT, SESSION_DEADLINE_S, TINY, ok, run_session  # noqa: E402

from weightbridge.canonical.bundled import bundled_config_path  # noqa: E402

TEST_MODULE = '''
def test_writes_into_tmp_path(tmp_path):
    (tmp_path / "out.txt").write_text("x")
'''


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.slow
def test_nothing_is_written_outside_the_roots(tmp_path: Path) -> None:
    root, home, tmp = tmp_path / "root", tmp_path / "outside" / "home", tmp_path / "outside" / "tmp"
    for d in (root, home, tmp):
        d.mkdir(parents=True)
    shutil.copy(bundled_config_path("tiny-qwen2"), root / "config.json")
    shutil.copy(ROOT / TINY, root / "tiny.yaml")
    (root / "test_uses_tmp_path.py").write_text(TEST_MODULE)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "WEIGHTBRIDGE_CACHE_DIR")}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.server", "--root", str(root)],
                                   cwd=str(root), env=env)

    async def body(c: Client):
        return [
            await c.call_tool("inspect_model", {"model": "config.json"}),
            await c.call_tool("validate_spec", {"spec_path": "tiny.yaml"}),
            await c.call_tool("plan_transfer", {"spec_path": "tiny.yaml"}),
            await c.call_tool("probe_layout", {"spec_path": "tiny.yaml", "loader": "tests.probe._zoo:vllm_factory"}),
            await c.call_tool("run_conformance", {"tests": ["test_uses_tmp_path.py"], "timeout_s": 300}),
        ]

    results = run_session(Client(params, read_timeout_seconds=SESSION_DEADLINE_S), body, deadline_s=600)
    for res in results:
        ok(res)
    assert ok(results[3])["matches_spec"] is True and ok(results[4])["passed"] is True
    assert files_under(home) == [] and files_under(tmp) == []
    state = root / ".weightbridge-mcp"
    assert (state / ".gitignore").read_text().splitlines()[-1] == "*"
    assert list((state / "cache" / "canonical").iterdir()), "the canonical model cache is not in the state directory"
    assert files_under(state / "tmp") == []  # every call's directory was removed
