"""Shared by tests/mcp_agent: drive the weightbridge MCP server with the SDK's real Client."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult

from mcp_server.roots import ServerConfig
from mcp_server.server import build_server

ROOT = Path(__file__).resolve().parents[2]
TINY = "spec/examples/tiny_fsdp2_to_vllm.yaml"
FIVE_MISTAKES = "tests/spec/data/five_mistakes.yaml"
# Client modes and the protocol version each negotiates with this server.
MODES = {"legacy": "2025-11-25", "auto": "2026-07-28"}
ALL_TOOLS = {"inspect_model", "generate_spec", "validate_spec", "plan_transfer", "explain_tensor", "probe_layout",
             "run_conformance"}
SESSION_DEADLINE_S = 120


def run_session(client: Client, body: Callable[[Client], Awaitable[Any]], deadline_s: float = SESSION_DEADLINE_S) -> Any:
    """Open ``client``, run ``body(client)``, close; fail after ``deadline_s``."""

    async def main() -> Any:
        with anyio.fail_after(deadline_s):
            async with client:
                return await body(client)

    return anyio.run(main)


def in_process(mode: str, **config: Any) -> Client:
    """A Client connected in process to a server built from ServerConfig(**config) (base_dir: the repo)."""
    config.setdefault("base_dir", ROOT)
    return Client(build_server(ServerConfig(**config)), mode=mode, read_timeout_seconds=SESSION_DEADLINE_S)


def over_stdio(mode: str, *args: str, cwd: Path = ROOT) -> Client:
    """A Client talking to ``python -m mcp_server.server ARGS`` over stdio, as an MCP host runs it.

    With this process's environment (less pytest's own variables): the SDK would pass only HOME, PATH,
    ..., and without PYTHONPATH a checkout's server would be whatever ``mcp_server`` is installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.server", *args], cwd=str(cwd),
                                   env=env)
    return Client(params, mode=mode, read_timeout_seconds=SESSION_DEADLINE_S)


def error_text(result: CallToolResult, tool: str) -> str:
    """The text of an is_error result, checked to be an anticipated error (never masked, never a traceback)."""
    assert result.is_error, result.structured_content
    text = result.content[0].text  # type: ignore[union-attr]
    assert "Traceback" not in text and 'File "' not in text, text
    assert text.strip() != f"Error executing tool {tool}", "a crash: the real error was masked"
    return text


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured result of a successful call."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content
