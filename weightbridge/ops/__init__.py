"""Operations the CLI and the MCP server share (one implementation, two front ends).

* :mod:`.planning` — ``plan_spec``: one planning run of a resolved spec (network, build, validate,
  metrics) and ``top_imbalances``;
* :mod:`.draft` — ``draft_spec``: a starting spec from a short description;
* :mod:`.models` — ``source_for``: the ``model:`` mapping a name or path means.

Layering: above ``spec/``, ``plan/`` and ``canonical/``; below ``cli/`` and ``mcp_server/``, which
import these and never each other. Pure: no torch at import.
"""
