"""The ``weightbridge-mcp`` console script: the server, or how to install what it needs.

The server imports the MCP SDK (the ``mcp`` extra) at module level; without it the script used to end
in a traceback. Only a missing ``mcp`` package is turned into the install hint (exit 1); any other
import error is raised as it is.
"""

from __future__ import annotations

import sys

INSTALL_HINT = ("weightbridge-mcp needs the MCP SDK, which the 'mcp' extra installs: "
                "pip install 'weightbridge-rl[mcp]' (from a checkout: pip install -e '.[mcp]')")


def main(argv: list[str] | None = None) -> int:
    try:
        from mcp_server.server import main as serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "mcp":
            raise
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    return serve(argv)


if __name__ == "__main__":
    raise SystemExit(main())
