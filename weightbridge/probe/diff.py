"""Compare two layout IRs of one rank, whatever produced them (spec expansion, probe, DTensor).

Both sides are normalised (:func:`~weightbridge.layout.normalize.normalize_pieces`: adjacent
boxes merged, pieces sorted) so that a block stored as one box and the same block as rows
compare equal. When normalised pieces still differ (two valid box splits of one region
that greedy merging does not bring together) the tensors' element maps are compared,
for tensors up to ``max_elements``; equal element maps count as equal.

Sources for the CLI (:func:`load_source`): ``SPEC.yaml:SIDE:RANK`` (spec expansion) or a
JSON file (probe output, ``weightbridge explain --json`` output, or a
``RankLayout.to_json()`` such as DTensor introspection writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import LocalTensor, Piece, RankLayout
from weightbridge.layout.normalize import layout_fingerprint, normalize_layout, normalize_tensor  # noqa: F401 - re-exported

MAX_ELEMENTS = 50_000_000


@dataclass(frozen=True)
class TensorDiff:
    name: str
    message: str
    only_a: tuple[Piece, ...] = ()
    only_b: tuple[Piece, ...] = ()

    def format(self, limit: int = 3) -> str:
        lines = [f"{self.name}: {self.message}"]
        for tag, ps in (("A", self.only_a), ("B", self.only_b)):
            for p in ps[:limit]:
                lines.append(f"    only in {tag}: {p}")
            if len(ps) > limit:
                lines.append(f"    ... and {len(ps) - limit} more piece(s) only in {tag}")
        return "\n".join(lines)


def _same_elements(a: LocalTensor, b: LocalTensor) -> bool:
    import numpy as np

    from weightbridge.probe.compress import element_map

    names = sorted({p.canonical for p in a.pieces + b.pieces})
    bases, off = {}, 0
    for n in names:
        boxes = [p.canonical_box for p in a.pieces + b.pieces if p.canonical == n]
        shape = tuple(max(box[d][1] for box in boxes) for d in range(len(boxes[0])))
        bases[n] = (off, shape)
        off += int(np.prod(shape)) if shape else 1
    return bool(np.array_equal(element_map(a.pieces, a.shape, bases), element_map(b.pieces, b.shape, bases)))


def diff_layouts(
    a: RankLayout, b: RankLayout, *, dtypes: bool = True, strict: bool = False, max_elements: int = MAX_ELEMENTS
) -> list[TensorDiff]:
    """Per-tensor differences between ``a`` and ``b`` (empty: identical layouts).

    A local tensor holding no canonical element (no pieces, e.g. a vocabulary shard that is
    all padding) counts as absent unless ``strict``: a probe cannot see such a tensor as
    part of the layout, and it carries nothing to transfer. ``dtypes=False`` ignores
    dtype differences.
    """
    ta = {t.name: t for t in a.tensors if strict or t.pieces}
    tb = {t.name: t for t in b.tensors if strict or t.pieces}
    out: list[TensorDiff] = []
    for name in sorted(set(ta) | set(tb)):
        if name not in tb:
            out.append(TensorDiff(name, f"only in A ({list(ta[name].shape)} {ta[name].dtype})", ta[name].pieces))
            continue
        if name not in ta:
            out.append(TensorDiff(name, f"only in B ({list(tb[name].shape)} {tb[name].dtype})", (), tb[name].pieces))
            continue
        x, y = ta[name], tb[name]
        if x.shape != y.shape:
            out.append(TensorDiff(name, f"shape {list(x.shape)} vs {list(y.shape)}"))
            continue
        if dtypes and x.dtype != y.dtype:
            out.append(TensorDiff(name, f"dtype {x.dtype} vs {y.dtype}"))
            continue
        nx, ny = normalize_tensor(x), normalize_tensor(y)
        if nx.pieces == ny.pieces:
            continue
        if x.numel <= max_elements and len(x.shape) > 0 and _same_elements(nx, ny):
            continue
        sx, sy = set(nx.pieces), set(ny.pieces)
        only_a = tuple(p for p in nx.pieces if p not in sy)
        only_b = tuple(p for p in ny.pieces if p not in sx)
        ca = sum(box_numel(p.local_box) for p in nx.pieces)
        cb = sum(box_numel(p.local_box) for p in ny.pieces)
        msg = f"pieces differ ({len(nx.pieces)} vs {len(ny.pieces)} pieces, {ca} vs {cb} elements mapped)"
        out.append(TensorDiff(name, msg, only_a, only_b))
    return out


def format_diff(diffs: list[TensorDiff], limit: int = 20) -> str:
    lines = [d.format() for d in diffs[:limit]]
    if len(diffs) > limit:
        lines.append(f"... and {len(diffs) - limit} more tensor(s) differ")
    return "\n".join(lines)


class SourceError(ValueError):
    """A diff source that cannot be read (user error)."""


def load_source(source: str) -> RankLayout:
    """``SPEC.yaml:SIDE:RANK`` or a JSON file holding a rank layout (probe output included)."""
    path = Path(source)
    if path.suffix == ".json" or (path.is_file() and not source.count(":") >= 2):
        if not path.is_file():
            raise SourceError(f"{source}: no such file")
        try:
            from weightbridge.probe.probe import read_probe_json

            return read_probe_json(path)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SourceError(f"{source}: not a layout JSON ({exc})") from exc
    parts = source.rsplit(":", 2)
    if len(parts) != 3:
        raise SourceError(f"{source}: expected SPEC.yaml:SIDE:RANK or a .json file")
    spec, side, rank_s = parts
    if side not in ("trainer", "rollout"):
        raise SourceError(f"{source}: side must be trainer or rollout, got {side!r}")
    try:
        rank = int(rank_s)
    except ValueError:
        raise SourceError(f"{source}: rank must be an integer, got {rank_s!r}") from None
    from weightbridge.spec.errors import SpecErrors
    from weightbridge.spec.resolve import resolve_spec

    try:
        resolved = resolve_spec(spec)
    except SpecErrors as exc:
        raise SourceError(f"{spec}: invalid spec\n{exc}") from exc
    lay = resolved.side(side)
    if not 0 <= rank < lay.world_size:
        raise SourceError(f"{source}: rank {rank} out of range: the {side} has ranks 0..{lay.world_size - 1}")
    return lay.ranks[rank]
