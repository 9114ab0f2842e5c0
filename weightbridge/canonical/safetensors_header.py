"""Canonical model of a safetensors checkpoint, read from headers only.

Frame: in — a ``.safetensors`` file, a directory (``model.safetensors.index.json``
+ shards, or ``*.safetensors`` files), or an index file; out — one canonical
tensor per header entry (name, shape, dtype as stored: an FP8 checkpoint yields
``float8_e4m3fn`` weights plus its ``weight_scale_inv`` tensors).

A safetensors file starts with an 8-byte little-endian header length N, then N
bytes of JSON ``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": ...}``;
only those bytes are read, never tensor data.

Params come from a ``config.json`` beside the checkpoint when present, completed
(never overridden) by what tensor names imply (``layers.N``, ``experts.E``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from weightbridge.canonical.configfile import check_path, config_dtype, read_config, read_json
from weightbridge.canonical.errors import CanonicalSourceError
from weightbridge.canonical.quantized import from_fp8_header
from weightbridge.spec.errors import show
from weightbridge.canonical.naming import sort_tensors
from weightbridge.canonical.params import merge_params, params_from_config, params_from_names
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, normalize_dtype

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 512 * 1024 * 1024  # a larger header means a corrupt (or non-safetensors) file
_KEY = "safetensors"


def from_safetensors(path: str | Path) -> CanonicalModel:
    """Canonical model of a checkpoint file, index or directory (headers only)."""
    p = check_path(Path(path).expanduser(), _KEY)
    files, index_map = _checkpoint_files(p)
    found: dict[str, CanonicalTensor] = {}
    owner: dict[str, Path] = {}
    for f in files:
        for t in read_header(f):
            if t.name in found:
                raise CanonicalSourceError(_KEY, f"tensor {show(t.name)} appears in both {owner[t.name]} and {f}")
            found[t.name] = t
            owner[t.name] = f
    if index_map is not None:
        missing = sorted(set(index_map) - set(found))
        if missing:
            raise CanonicalSourceError(
                _KEY, f"{len(missing)} tensor(s) of the index are in no shard header, e.g. {show(missing[0])}"
            )
    tensors = sort_tensors(found.values())
    config: dict[str, Any] | None = None
    base = p if p.is_dir() else p.parent
    if (base / "config.json").is_file():
        config = read_config(base / "config.json", _KEY)[0]
    params = merge_params(params_from_names(tensors), params_from_config(config) if config else {})
    model = CanonicalModel(tensors=tensors, params=params, source=f"safetensors:{p}")
    return from_fp8_header(model, config, config_dtype(config) if config else None)  # FP8 weights: their scales


def _checkpoint_files(p: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Shard files to read, and the index's weight_map when an index is used."""
    if p.is_dir():
        if (p / INDEX_NAME).is_file():
            return _index_files(p / INDEX_NAME)
        if (p / SINGLE_NAME).is_file():
            return [p / SINGLE_NAME], None
        shards = sorted(p.glob("*.safetensors"))
        if not shards:
            raise CanonicalSourceError(_KEY, f"directory has no {INDEX_NAME} and no *.safetensors file: {p}")
        return shards, None
    if not p.is_file():
        raise CanonicalSourceError(_KEY, f"no such file or directory: {p}")
    if p.name.endswith(".json"):
        return _index_files(p)
    return [p], None


def _index_files(index: Path) -> tuple[list[Path], dict[str, str]]:
    obj = read_json(index, _KEY, "checkpoint index")
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CanonicalSourceError(_KEY, f"{index} has no weight_map object of name -> shard file")
    files = [index.parent / name for name in sorted(set(weight_map.values()))]
    for f in files:
        if not f.is_file():
            raise CanonicalSourceError(_KEY, f"shard listed in {index.name} is missing: {f}")
    return files, weight_map


def read_header(path: str | Path) -> list[CanonicalTensor]:
    """Tensors declared by one safetensors file's header, in header order."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise CanonicalSourceError(_KEY, f"{p} is too short to be a safetensors file")
            (size,) = struct.unpack("<Q", head)
            if size > _MAX_HEADER:
                raise CanonicalSourceError(_KEY, f"{p}: header length {size} is implausible; not a safetensors file?")
            blob = fh.read(size)
    except OSError as exc:
        raise CanonicalSourceError(_KEY, f"cannot read {p}: {exc}") from exc
    if len(blob) != size:
        raise CanonicalSourceError(_KEY, f"{p}: header truncated ({len(blob)} of {size} bytes)")
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CanonicalSourceError(_KEY, f"{p}: header is not JSON: {exc}") from exc
    except RecursionError:
        raise CanonicalSourceError(_KEY, f"{p}: header is not a safetensors header (nested too deeply)") from None
    if not isinstance(header, dict):
        raise CanonicalSourceError(_KEY, f"{p}: header is not a JSON object")
    return [_entry(p, name, info) for name, info in header.items() if name != "__metadata__"]


def _entry(p: Path, name: str, info: Any) -> CanonicalTensor:
    if not isinstance(info, dict):
        raise CanonicalSourceError(_KEY, f"{p}: entry {show(name)} is not an object")
    raw_dtype, shape = info.get("dtype"), info.get("shape")
    dtype = normalize_dtype(raw_dtype) if isinstance(raw_dtype, str) else None
    if dtype is None:
        raise CanonicalSourceError(_KEY, f"{p}: tensor {show(name)} has unsupported dtype {show(raw_dtype)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CanonicalSourceError(_KEY, f"{p}: tensor {show(name)} has a bad shape {show(shape)}")
    return CanonicalTensor(name, tuple(shape), dtype)
