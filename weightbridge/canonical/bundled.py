"""HF ``config.json`` files shipped with weightbridge (``bundled/*.json``).

Names are file stems (``qwen3-30b-a3b``); ``tiny-*`` are small test configs of
the same architectures. See ``bundled/README.md`` for provenance and edits.
"""

from __future__ import annotations

from pathlib import Path

from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.spec.errors import show

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


def bundled_names() -> list[str]:
    """Sorted names of the bundled configs."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))


def bundled_config_path(name: str) -> Path:
    """Path of bundled config ``name``; CanonicalSourceError (key ``bundled``) if there is none."""
    names = bundled_names()
    if not isinstance(name, str) or name not in names:
        raise CanonicalSourceError("bundled", f"unknown bundled model {show(name)}", f"known: {', '.join(names)}")
    return BUNDLED_DIR / f"{name}.json"
