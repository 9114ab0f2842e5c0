"""Human/JSON summaries of a canonical model (``weightbridge models``, MCP tool).

Frame: canonical tensors. Tensors are grouped by :func:`name_pattern` (every
all-digit name component becomes ``*``), groups listed in order of their first
tensor in the model's (natural) order.
"""

from __future__ import annotations

from typing import Any

from weightbridge.canonical.naming import name_pattern
from weightbridge.layout.ir import DTYPE_BYTES, CanonicalModel


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def summarize(model: CanonicalModel) -> dict[str, Any]:
    """JSON-ready summary.

    ``{"source", "params", "groups": [{"pattern", "count", "shapes", "dtypes",
    "numel", "bytes"}], "totals": {"tensors", "numel", "bytes", "by_dtype":
    {dtype: {"tensors", "numel", "bytes"}}}}``; ``shapes``/``dtypes`` list the
    distinct values in first-seen order (usually one each).
    """
    groups: dict[str, dict[str, Any]] = {}
    by_dtype: dict[str, dict[str, int]] = {}
    total_numel = total_bytes = 0
    for t in model.tensors:
        numel = _numel(t.shape)
        nbytes = numel * DTYPE_BYTES.get(t.dtype, 0)
        g = groups.setdefault(
            name_pattern(t.name),
            {"pattern": name_pattern(t.name), "count": 0, "shapes": [], "dtypes": [], "numel": 0, "bytes": 0},
        )
        g["count"] += 1
        if list(t.shape) not in g["shapes"]:
            g["shapes"].append(list(t.shape))
        if t.dtype not in g["dtypes"]:
            g["dtypes"].append(t.dtype)
        g["numel"] += numel
        g["bytes"] += nbytes
        d = by_dtype.setdefault(t.dtype, {"tensors": 0, "numel": 0, "bytes": 0})
        d["tensors"] += 1
        d["numel"] += numel
        d["bytes"] += nbytes
        total_numel += numel
        total_bytes += nbytes
    return {
        "source": model.source,
        "params": dict(model.params),
        "groups": list(groups.values()),
        "totals": {
            "tensors": len(model.tensors),
            "numel": total_numel,
            "bytes": total_bytes,
            "by_dtype": dict(sorted(by_dtype.items())),
        },
    }


def human_count(n: int) -> str:
    """``671026419200`` -> ``671.03B``; ``7615616512`` -> ``7.62B``; small numbers as is."""
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def human_bytes(n: int) -> str:
    """Bytes in binary units: ``1342177280`` -> ``1.25 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"
