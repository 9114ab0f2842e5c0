"""tests/mcp_agent needs the `mcp` extra: without it each module skips, saying so (``importorskip`` at its
top: a conftest may not skip), unless ``WEIGHTBRIDGE_REQUIRE_MCP=1`` (CI) makes its absence a failure."""

import importlib.util
import os


def _have_mcp() -> bool:
    # The SDK's own submodule: a bare "mcp" can resolve to this directory (a namespace package)
    # when tests/ is on sys.path.
    try:
        return importlib.util.find_spec("mcp.server.mcpserver") is not None
    except ImportError:
        return False


if not _have_mcp():
    if os.environ.get("WEIGHTBRIDGE_REQUIRE_MCP") == "1":
        raise ImportError("WEIGHTBRIDGE_REQUIRE_MCP=1 but the `mcp` package is missing: pip install -e '.[mcp]'")
