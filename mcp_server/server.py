"""Build the weightbridge MCP server and run it over stdio (console script ``weightbridge-mcp``).

``weightbridge-mcp [--root DIR]... [--read-only] [--cwd DIR] [--max-timeout S] [--call-timeout S] [--worker-memory MB]
[--state-dir DIR]``

Tools (each a thin layer over the function the CLI calls): inspect_model, generate_spec,
validate_spec, plan_transfer, explain_tensor, probe_layout, run_conformance. ``--read-only``
hides the tools that run code (probe_layout, run_conformance) and generate_spec's write_to.
Every path a tool reads or writes must lie inside a ``--root``, and so do the server's own temporary
files and caches (``--state-dir``, :mod:`mcp_server.scratch`); the work of each call runs in a worker
process that is killed after ``--call-timeout`` seconds or when the client cancels. Each tool's
declared input schema is exactly what it accepts (:mod:`mcp_server.declared`).
"""

from __future__ import annotations

import argparse
import logging
import os
from importlib.metadata import PackageNotFoundError, version

from mcp.server.mcpserver import MCPServer

from mcp_server import conformance, resources, tools_model, tools_plan, tools_probe, tools_spec, worker
from mcp_server.declared import ToolSet, middleware
from mcp_server.roots import ServerConfig

INSTRUCTIONS = """\
weightbridge moves updated model weights from RL trainers (Megatron-Core, FSDP2) to rollout engines
(vLLM, SGLang). A YAML spec says which model and how each side lays it out. Typical order:
inspect_model -> generate_spec -> validate_spec -> explain_tensor / probe_layout -> plan_transfer ->
run_conformance. Spec paths are relative to the server's working directory; files are read and
written only inside its allowed roots. The prompt integrate_framework has the full checklist."""

TOOLS_RUNNING_CODE = ("probe_layout", "run_conformance")


def _version() -> str:
    try:
        return version("weightbridge-rl")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def build_server(config: ServerConfig | None = None) -> MCPServer:
    """A configured server (not started): ``Client(build_server(cfg))`` talks to it in process."""
    config = config or ServerConfig()
    tools = ToolSet()  # each tool's declared input schema is what middleware() lets through (declared.py)
    tools_model.register(tools, config)
    tools_spec.register(tools, config)
    tools_plan.register(tools, config)
    if not config.read_only:
        tools_probe.register(tools, config)
        conformance.register(tools, config)
    server = MCPServer("weightbridge", title="weightbridge", version=_version(), instructions=INSTRUCTIONS,
                       log_level="WARNING", tools=list(tools.tools.values()))
    resources.register(server)
    server.middleware.append(middleware(tools, server))
    worker.ZYGOTE.start()  # the tools' worker processes fork from it; it imports while the client connects
    return server


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    p = argparse.ArgumentParser(prog="weightbridge-mcp", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", action="append", default=[], metavar="DIR",
                   help="directory where tools may write files and run tests (repeatable; default: --cwd)")
    p.add_argument("--read-only", action="store_true", help="hide tools that write files or run code")
    p.add_argument("--cwd", default=None, metavar="DIR", help="directory relative paths resolve against (default: .)")
    p.add_argument("--max-timeout", type=int, default=1800, metavar="S", help="upper bound of any timeout_s argument")
    p.add_argument("--call-timeout", type=float, default=120.0, metavar="S",
                   help="wall-clock limit of one call's worker process (spec, plan, explain, inspect); default 120")
    p.add_argument("--worker-memory", type=int, default=4096, metavar="MB", help="address-space limit of a worker process")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where the server writes temporary files and caches, inside a root "
                   "(default: ROOT/.weightbridge-mcp of the first --root)")
    args = p.parse_args(argv)
    for name, value in (("--max-timeout", args.max_timeout), ("--call-timeout", args.call_timeout),
                        ("--worker-memory", args.worker_memory)):
        if not value > 0:
            p.error(f"{name}: must be positive, got {value}")
    for d in [*args.root, *([args.cwd] if args.cwd else [])]:
        if not os.path.isdir(d):
            p.error(f"{d}: not a directory")
    try:
        return ServerConfig(base_dir=args.cwd or os.getcwd(), roots=tuple(args.root), read_only=args.read_only,
                            max_timeout_s=args.max_timeout, call_timeout_s=args.call_timeout,
                            worker_memory_mb=args.worker_memory, state_dir=args.state_dir)
    except ValueError as exc:  # a --state-dir outside the roots
        p.error(f"--state-dir: {exc}")


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    build_server(config).run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
