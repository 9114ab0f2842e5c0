"""Reading a HF ``config.json`` into a plain dict (no transformers import).

Frame: the raw JSON object of a HF model config, as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.layout.ir import normalize_dtype

FLOAT_DTYPES: frozenset[str] = frozenset({"float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"})


def resolve_config_path(path: str | Path, key: str = "config") -> Path:
    """``path`` itself if a file, ``path/config.json`` if a directory; else CanonicalSourceError."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise CanonicalSourceError(key, f"directory has no config.json: {p}")
        return p / "config.json"
    if not p.is_file():
        raise CanonicalSourceError(key, f"no such file or directory: {p}")
    return p


def read_config(path: str | Path, key: str = "config") -> tuple[dict[str, Any], Path]:
    """The JSON object of a config file (or of ``config.json`` in a directory), and its path."""
    p = resolve_config_path(path, key)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CanonicalSourceError(key, f"cannot read {p} as JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CanonicalSourceError(key, f"{p} does not hold a JSON object")
    return obj, p


def config_dtype(config: dict[str, Any]) -> str | None:
    """The config's default dtype (``dtype``, or legacy ``torch_dtype``), torch spelling, or None."""
    raw = config.get("dtype") or config.get("torch_dtype")
    if isinstance(raw, str):
        return normalize_dtype(raw)
    return None


def check_float_dtype(dtype: str, key: str = "dtype") -> str:
    """Torch spelling of a floating dtype name; CanonicalSourceError otherwise."""
    norm = normalize_dtype(dtype) if isinstance(dtype, str) else None
    if norm is None or norm not in FLOAT_DTYPES:
        allowed = ", ".join(sorted(FLOAT_DTYPES))
        raise CanonicalSourceError(key, f"not a floating dtype: {dtype!r}", f"use one of {allowed}")
    return norm
