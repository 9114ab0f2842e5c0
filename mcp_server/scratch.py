"""Where the server writes its own files: the state directory, inside the roots.

Nothing the server, its worker processes or the subprocesses it starts (``weightbridge probe``,
pytest) write by default lands outside the roots: not ``$TMPDIR``, not ``~/.cache``. The state
directory (``--state-dir``, default ``.weightbridge-mcp`` in the first root; created on first use,
with a ``.gitignore`` of ``*``) holds

* ``tmp/``: one directory per call (a worker's job, a subprocess's output, pytest's junit XML); each
  is the ``TMPDIR`` of what runs in it, so pytest's default ``--basetemp`` lies there too, and it is
  removed when the call ends;
* ``cache/``: ``WEIGHTBRIDGE_CACHE_DIR`` (canonical models, probe caches) unless the server's
  environment sets one inside the roots; ``cache/xdg`` is the subprocesses' ``XDG_CACHE_HOME``
  (libraries that follow it: Hugging Face, vLLM, ...) unless the environment sets one inside the roots;
* ``pycache/``: the subprocesses' ``PYTHONPYCACHEPREFIX`` (bytecode of the code they import).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mcp_server.roots import ServerConfig

CACHE_ENV = "WEIGHTBRIDGE_CACHE_DIR"


def state(config: ServerConfig) -> Path:
    """The state directory, created (with a ``.gitignore``: it is no part of the user's project) when missing."""
    path = config.state_dir
    assert path is not None  # set by ServerConfig
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by weightbridge-mcp (temporary files and caches)\n*\n")
    return path


def tmp_root(config: ServerConfig) -> Path:
    """``STATE/tmp``, where every per-call directory is made."""
    path = state(config) / "tmp"
    path.mkdir(exist_ok=True)
    return path


def call_dir(config: ServerConfig, prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for one call under ``STATE/tmp`` (a context manager; removed at its end)."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=tmp_root(config))


def _inside(config: ServerConfig, raw: str | None) -> bool:
    if not raw:
        return False
    try:
        return config.is_inside(Path(raw).expanduser().resolve())
    except (OSError, RuntimeError, ValueError):
        return False


def cache_dir(config: ServerConfig, env: Mapping[str, str] | None = None) -> Path:
    """``WEIGHTBRIDGE_CACHE_DIR`` of the environment when it lies inside the roots, else ``STATE/cache``."""
    raw = (os.environ if env is None else env).get(CACHE_ENV)
    if _inside(config, raw):
        return Path(str(raw)).expanduser().resolve()
    return state(config) / "cache"


def child_env(config: ServerConfig, tmp: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess run in the per-call directory ``tmp``: the server's (``env``), with
    ``TMPDIR``, ``WEIGHTBRIDGE_CACHE_DIR``, ``XDG_CACHE_HOME`` and ``PYTHONPYCACHEPREFIX`` inside the roots."""
    out = dict(os.environ if env is None else env)
    out["TMPDIR"] = str(tmp)
    out[CACHE_ENV] = str(cache_dir(config, out))
    if not _inside(config, out.get("XDG_CACHE_HOME")):
        out["XDG_CACHE_HOME"] = str(state(config) / "cache" / "xdg")
    if not _inside(config, out.get("PYTHONPYCACHEPREFIX")):
        out["PYTHONPYCACHEPREFIX"] = str(state(config) / "pycache")
    return out
