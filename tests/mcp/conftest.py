"""tests/mcp needs the `mcp` extra: without it the directory is skipped, saying so, unless
``WEIGHTBRIDGE_REQUIRE_MCP=1`` (CI) makes its absence a failure."""

import importlib.util
import os

import pytest

if importlib.util.find_spec("mcp") is None:
    if os.environ.get("WEIGHTBRIDGE_REQUIRE_MCP") == "1":
        raise ImportError("WEIGHTBRIDGE_REQUIRE_MCP=1 but the `mcp` package is missing: pip install -e '.[mcp]'")
    pytest.skip("the MCP server needs the `mcp` extra: pip install 'weightbridge-rl[mcp]'", allow_module_level=True)
