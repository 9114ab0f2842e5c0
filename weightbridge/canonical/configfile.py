"""Reading a HF ``config.json`` into a plain dict (no transformers import).

Frame: the raw JSON object of a HF model config, as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.layout.ir import normalize_dtype
from weightbridge.spec.errors import excerpt, show

FLOAT_DTYPES: frozenset[str] = frozenset({"float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"})


MAX_JSON_BYTES = 256 * 1024 * 1024  # a config.json is KiBs, a checkpoint index MiBs; /dev/zero is neither


def check_path(path: Path, key: str) -> Path:
    """``path`` if the OS can look it up at all; CanonicalSourceError for a NUL byte or a name too long."""
    try:
        path.stat()
    except ValueError:
        raise CanonicalSourceError(key, f"the path contains a NUL byte: {show(str(path))}") from None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise CanonicalSourceError(key, f"cannot access {excerpt(str(path))}: {exc.strerror or exc}") from None
    return path


def resolve_config_path(path: str | Path, key: str = "config") -> Path:
    """``path`` itself if a file, ``path/config.json`` if a directory; else CanonicalSourceError."""
    p = check_path(Path(path).expanduser(), key)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise CanonicalSourceError(key, f"directory has no config.json: {p}")
        return p / "config.json"
    if not p.is_file():
        raise CanonicalSourceError(key, f"no such file or directory: {p}")
    return p


def read_json(p: Path, key: str, what: str = "JSON") -> Any:
    """The JSON value in file ``p`` (at most MAX_JSON_BYTES); CanonicalSourceError when it is not one."""
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise CanonicalSourceError(key, f"{p} is larger than {MAX_JSON_BYTES:,} bytes: not a {what} file")
        return json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CanonicalSourceError(key, f"cannot read {p} as {what}: {excerpt(str(exc))}") from exc
    except RecursionError:
        raise CanonicalSourceError(key, f"cannot read {p} as {what}: nested too deeply") from None


def read_config(path: str | Path, key: str = "config") -> tuple[dict[str, Any], Path]:
    """The JSON object of a config file (or of ``config.json`` in a directory), and its path."""
    p = resolve_config_path(path, key)
    obj = read_json(p, key)
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
        raise CanonicalSourceError(key, f"not a floating dtype: {show(dtype)}", f"use one of {allowed}")
    return norm
