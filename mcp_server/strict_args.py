"""Middleware: a ``tools/call`` with an argument the tool does not declare fails, naming it.

The SDK ignores unknown arguments, so a misspelt optional argument (``spec_file`` for
``spec_path``) would silently do nothing; this turns it into an ``is_error`` result with a
did-you-mean.
"""

from __future__ import annotations

import difflib
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

from mcp_server.roots import clip, excerpt


def reject_unknown_arguments(server: MCPServer) -> Any:
    """A ServerMiddleware for ``server`` (append it to ``server.middleware``)."""
    known: dict[str, list[str]] = {}

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        args = params.get("arguments")
        if ctx.method != "tools/call" or not isinstance(args, dict):
            return await call_next(ctx)
        if not known:
            known.update({t.name: list((t.input_schema or {}).get("properties", {})) for t in await server.list_tools()})
        allowed = known.get(str(params.get("name")))
        unknown = sorted(set(args) - set(allowed)) if allowed is not None else []
        if not unknown:
            return await call_next(ctx)
        lines = []
        for name in unknown[:10]:
            close = difflib.get_close_matches(name, allowed, n=1) if len(name) <= 100 else []
            shown = name if len(name) <= 100 else excerpt(name, 60)
            lines.append(f"{shown}: unknown argument" + (f"; did you mean {close[0]!r}?" if close else "")
                         + f" (arguments: {', '.join(allowed)})")
        if len(unknown) > 10:
            lines.append(f"... and {len(unknown) - 10} more unknown arguments")
        return CallToolResult(content=[TextContent(type="text", text=clip("\n".join(lines)))], is_error=True)

    return middleware
