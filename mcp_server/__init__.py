"""weightbridge MCP server: the operations an engineer has, for coding agents.

A thin layer over weightbridge's public API (the same functions the ``weightbridge``
CLI calls). Start it with ``weightbridge-mcp`` (stdio); build one in process with
:func:`mcp_server.server.build_server`. See ``mcp_server/README.md``.
"""
