"""The canonical tensor lists of the bundled configs, shipped with the package (``bundled/tensors/``).

Why: a bundled model's canonical model otherwise needs transformers and a meta-device
instantiation on a cold cache (DeepSeek-V3: ~6 s, most of a rank's spec resolution). The list is
what ``save_pretrained`` of the *installed* transformers writes, and that changes between
versions (DeepSeek-V3's router weight is float32 in 5.24, bfloat16 in 5.19), so a list is kept
per transformers version it was computed with (``python -m weightbridge.canonical.bundled_tensors
--write`` under that version; the tests compare it with transformers' build) and used only when
that exact version is installed (read from its metadata: transformers is not imported). Any other
version builds the model with transformers once, as before, and the canonical cache keeps it.

Format (a few KiB per model and version, not the ~6 MB of a plain list): tensors grouped by
(skeleton, shape, dtype), each group's digit runs as the product of integer ranges where they
are one (``layers 3..60 x experts 0..255``), else listed. Decoding restores :func:`natural_key`
order. Pure (no torch); :func:`shipped_tensors` is what :mod:`weightbridge.canonical` calls.
"""

from __future__ import annotations

import itertools
import json
from importlib import metadata
from math import prod
from pathlib import Path
from typing import Any

from weightbridge.canonical.bundled import BUNDLED_DIR
from weightbridge.canonical.naming import sort_tensors, split_key
from weightbridge.layout.ir import CanonicalTensor
from weightbridge.layout.templates import skeleton

SHIPPED_DIR = BUNDLED_DIR / "tensors"
FORMAT = 2


def encode(tensors: tuple[CanonicalTensor, ...]) -> list[list[Any]]:
    """Groups ``[skeleton, shape, dtype, numbers]``; ``numbers`` is ``{"ranges": [[lo, hi], ...]}``
    (their product, ``hi`` exclusive) or ``{"list": [[n, ...], ...]}``."""
    groups: dict[tuple[str, tuple[int, ...], str], list[tuple[int, ...]]] = {}
    for t in tensors:
        skel, nums = skeleton(t.name)
        groups.setdefault((skel, tuple(t.shape), t.dtype), []).append(nums)
    out: list[list[Any]] = []
    for (skel, shape, dtype), numbers in sorted(groups.items()):
        out.append([skel, list(shape), dtype, _numbers(numbers)])
    return out


def _numbers(numbers: list[tuple[int, ...]]) -> dict[str, Any]:
    width = len(numbers[0])
    axes = [sorted({n[i] for n in numbers}) for i in range(width)]
    contiguous = all(a == list(range(a[0], a[-1] + 1)) for a in axes)
    if contiguous and len(set(numbers)) == len(numbers) and len(numbers) == prod(len(a) for a in axes):
        return {"ranges": [[a[0], a[-1] + 1] for a in axes]}
    return {"list": sorted(numbers)}


def decode(groups: list[list[Any]]) -> tuple[CanonicalTensor, ...]:
    """The tensors ``encode`` was given, in natural-name order (:func:`~weightbridge.canonical.naming.natural_key`,
    from the parts each name is built of)."""
    keyed: list[tuple[tuple, CanonicalTensor]] = []
    for skel, shape, dtype, numbers in groups:
        texts = skel.split("#")
        pattern = skel.replace("{", "{{").replace("}", "}}").replace("#", "{}")  # one slot per digit run
        shape = tuple(int(d) for d in shape)
        if "ranges" in numbers:
            tuples = itertools.product(*(range(lo, hi) for lo, hi in numbers["ranges"]))
        else:
            tuples = (tuple(n) for n in numbers["list"])
        for nums in tuples:
            name = pattern.format(*nums)
            keyed.append((split_key(texts, nums, name), CanonicalTensor(name, shape, str(dtype))))
    keyed.sort(key=lambda kt: kt[0])
    return tuple(t for _, t in keyed)


def shipped_path(name: str) -> Path:
    return SHIPPED_DIR / f"{name}.json"


def installed_transformers() -> str | None:
    """The installed transformers version (from its metadata, without importing it), or None."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def shipped_tensors(name: str, dtype: str) -> tuple[tuple[CanonicalTensor, ...], dict[str, Any]] | None:
    """The shipped list of bundled model ``name`` for the installed transformers version, and the
    params its names give (:func:`~weightbridge.canonical.params.params_from_names`, stored with
    it), when one was computed for that version and ``dtype``; else None (the caller builds it)."""
    version = installed_transformers()
    try:
        obj = json.loads(shipped_path(name).read_text(encoding="utf-8"))
        entry = obj["versions"].get(version) if obj.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    if not isinstance(entry, dict) or entry.get("dtype") != dtype:
        return None
    return decode(entry["groups"]), dict(entry["name_params"])


def write(name: str) -> Path:
    """Compute bundled model ``name``'s list with the installed transformers (no cache) and add it to
    its shipped file under that version (the versions already there stay)."""
    from weightbridge.canonical.bundled import bundled_config_path
    from weightbridge.canonical.configfile import config_dtype, read_config
    from weightbridge.canonical.hf_config import from_hf_config
    from weightbridge.canonical.params import params_from_names

    path = bundled_config_path(name)
    raw, _ = read_config(path, "bundled")
    dtype = config_dtype(raw) or "float32"
    tensors = from_hf_config(path, use_cache=False).tensors
    groups = encode(tensors)
    if decode(groups) != tensors or sort_tensors(tensors) != tensors:
        raise RuntimeError(f"{name}: the compact form does not round-trip")
    out = shipped_path(name)
    try:
        record = json.loads(out.read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            raise ValueError
    except (OSError, ValueError):
        record = {"format": FORMAT, "model": name, "versions": {}}
    record["versions"][installed_transformers()] = {"dtype": dtype, "name_params": params_from_names(tensors),
                                                   "groups": groups}
    record["versions"] = dict(sorted(record["versions"].items()))
    SHIPPED_DIR.mkdir(exist_ok=True)
    out.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    import argparse

    from weightbridge.canonical.bundled import bundled_names

    ap = argparse.ArgumentParser(description="(re)write the shipped canonical lists of the bundled configs")
    ap.add_argument("--write", action="store_true", required=True)
    ap.add_argument("names", nargs="*", help="bundled names (default: all)")
    args = ap.parse_args()
    for n in args.names or bundled_names():
        print(f"{write(n)}: done", flush=True)
