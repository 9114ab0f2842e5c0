"""HF ``config.json`` files shipped with weightbridge (``bundled/*.json``).

Names are file stems (``qwen3-30b-a3b``); ``tiny-*`` are small test configs of
the same architectures. See ``bundled/README.md`` for provenance and edits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def model_config_json(model: Any, spec_dir: str | Path) -> Path | None:
    """The HF ``config.json`` a spec's ``model`` section names: ``bundled`` (the shipped file) or
    ``config`` (a ``config.json`` or its directory, relative to ``spec_dir``); None for a model given
    by ``safetensors`` or inline ``tensors`` only. ``model``: the spec's ``ModelSource`` or its dict."""
    get = model.get if isinstance(model, dict) else (lambda key: getattr(model, key, None))
    if isinstance(get("bundled"), str):
        return bundled_config_path(get("bundled"))
    if isinstance(get("config"), str):
        path = Path(get("config"))
        path = path if path.is_absolute() else Path(spec_dir) / path
        return path / "config.json" if path.is_dir() else path
    return None


def transformers_config(model: Any, spec_dir: str | Path) -> Any:
    """The transformers config of a spec's ``model`` (:func:`model_config_json`; imports transformers);
    ValueError for a model given by ``safetensors`` or ``tensors`` only."""
    import json

    from transformers import AutoConfig

    path = model_config_json(model, spec_dir)
    if path is None:
        raise ValueError("the model is built from model.config or model.bundled; this spec gives neither")
    fields = json.loads(path.read_text())
    return AutoConfig.for_model(fields.pop("model_type"), **{k: v for k, v in fields.items() if k != "architectures"})
