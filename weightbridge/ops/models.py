"""The ``model:`` mapping a name or path means (``weightbridge models`` and the MCP server's tools)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weightbridge.canonical import bundled_names


def _lookup(path: Path) -> tuple[bool, bool]:
    """``(exists, is_dir)``, both False for a name the OS cannot look up (NUL byte, too long)."""
    try:
        return path.exists(), path.is_dir()
    except (OSError, ValueError):
        return False, False


def source_for(target: str, dtype: str | None = None) -> dict[str, Any]:
    """The ``model:`` mapping a name or path means (bundled name, config, or safetensors)."""
    src: dict[str, Any]
    path = Path(target).expanduser()
    exists, is_dir = _lookup(path)
    if target in bundled_names() and not exists:
        src = {"bundled": target}
    elif is_dir:
        has_weights = (path / "model.safetensors.index.json").is_file() or any(path.glob("*.safetensors"))
        src = {"safetensors": str(path)} if has_weights else {"config": str(path)}
    elif path.name.endswith(".safetensors") or path.name.endswith(".index.json"):
        src = {"safetensors": str(path)}
    elif exists or path.suffix == ".json":
        src = {"config": str(path)}
    else:
        src = {"bundled": target}
    if dtype:
        src["dtype"] = dtype
    return src
