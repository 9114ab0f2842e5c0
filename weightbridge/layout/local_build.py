"""One local tensor of one rank, built from a bound rule at the rank's mesh coordinates. Pure (no torch).

:class:`TensorBuilder` is the second half of :mod:`weightbridge.layout.expand`'s expander: given a
rule, one :class:`Binding` (its canonical names) and the rank's coordinates, it pads, shards step by
step (:func:`chunk_window`: ``torch.chunk`` semantics), concatenates, interleaves or stacks, and
returns the :class:`~weightbridge.layout.ir.LocalTensor` with its pieces. Problems are raised as
:class:`RuleProblem` (the expander records them against the rule's origin).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product as _product
from math import prod
from typing import Any

from weightbridge.layout.ir import CanonicalModel, LocalTensor, Piece, normalize_dtype
from weightbridge.layout.rules import Part, Rule, ShardOp


class RuleProblem(Exception):
    """A problem with one rule at one rank (message, hint, mesh axis, sub-path of the rule)."""

    def __init__(self, message: str, hint: str = "", axis: str = "", field: str = "") -> None:
        super().__init__(message)
        self.message, self.hint, self.axis, self.field = message, hint, axis, field


@dataclass
class Binding:
    """One instance of a rule: variable values and the canonical names of each part."""

    values: dict[str, Any]  # {layer}, {expert} values; {*} holds the whole name
    names: list[list[str]]  # per stacked expert (or one entry), per part
    experts: list[int]  # stacked experts, in order ([] when not stacked)
    layer: int | None


def relative_pieces(pieces: tuple[Piece, ...] | list[Piece], names: list[str]) -> tuple[tuple, ...]:
    """``pieces`` with each canonical name replaced by its position in ``names`` (all distinct): the
    geometry that tensors differing only in their canonical names share."""
    where = {n: k for k, n in enumerate(names)}
    return tuple((where[p.canonical], *p[1:]) for p in pieces)


def named_pieces(geometry: tuple[tuple, ...], names: list[str]) -> tuple[Piece, ...]:
    """The pieces of :func:`relative_pieces`' ``geometry`` for the tensors ``names``."""
    return tuple(Piece(names[k], cbox, lbox, tr) for k, cbox, lbox, tr in geometry)


def chunk_window(lo: int, hi: int, op: ShardOp, size: int, coord: int, blocks: int | None, what: str) -> tuple[int, int]:
    """The window of ``coord`` when ``[lo, hi)`` is dealt over ``size`` ranks."""
    if size == 1:
        return lo, hi
    length = hi - lo
    if blocks is not None:
        if blocks <= 0 or length % blocks:
            raise RuleProblem(f"{what}: extent {length} of dim {op.dim} does not split into {blocks} blocks", axis=op.axis)
        unit, units = length // blocks, blocks
    else:
        unit, units = 1, length
    if units < size and blocks is not None and not op.uneven:
        if not op.replicate:
            raise RuleProblem(
                f"{what}: {units} blocks of dim {op.dim} are fewer than {op.axis}={size} ranks",
                f"choose {op.axis} <= {units}" + ("" if size % units else ", or set replicate: true if the framework replicates them"),
                axis=op.axis,
            )
        if size % units:
            raise RuleProblem(
                f"{what}: {units} blocks of dim {op.dim} cannot be replicated evenly over {op.axis}={size}",
                f"{op.axis} must divide or be a multiple of {units}",
                axis=op.axis,
            )
        idx = coord // (size // units)
        return lo + idx * unit, lo + (idx + 1) * unit
    if units % size and not op.uneven:
        raise RuleProblem(
            f"{what}: dim {op.dim} ({units}{' blocks' if blocks else ''}) is not divisible by {op.axis}={size}",
            f"choose {op.axis} dividing {units}",
            axis=op.axis,
        )
    per = -(-units // size)  # torch.chunk: ceil-sized chunks, trailing ones may be short or empty
    a, b = min(coord * per, units), min((coord + 1) * per, units)
    return lo + a * unit, lo + b * unit


MAX_PERMUTE_PIECES = 1 << 16  # one piece per row of the dims a permutation cannot keep whole


def permuted_pieces(cname: str, cbox: tuple[tuple[int, int], ...], perm: tuple[int, ...], local: str) -> list[Piece]:
    """The pieces of a block ``cbox`` (canonical frame) stored as ``block.permute(*perm)``, local
    boxes relative to the block's origin.

    A piece holds its canonical box in row-major correspondence, dims reversed when transposed,
    unit dims ignored (:mod:`weightbridge.layout.box`). So a permutation is one piece when the
    kept dims appear in the local frame in canonical order (plain) or reversed (transposed); the
    other dims are cut into unit slices, one piece each. The kept dims are the set giving the
    fewest pieces (plain preferred on ties): ``[E, H, N].permute(0, 2, 1)`` is one transposed
    ``[1, H, N]`` piece per expert.
    """
    ext = [b - a for a, b in cbox]
    big = [d for d, n in enumerate(ext) if n > 1]
    where = {d: j for j, d in enumerate(perm)}  # canonical dim -> local dim
    best: tuple[int, int, frozenset[int]] | None = None
    for mask in range(1 << len(big)):
        keep = frozenset(d for k, d in enumerate(big) if mask >> k & 1)
        order = [where[d] for d in sorted(keep)]
        plain = order == sorted(order)
        if not plain and order != sorted(order, reverse=True):
            continue
        cost = prod(ext[d] for d in big if d not in keep)
        key = (cost, 0 if plain else 1, keep)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None  # keeping one dim (or none) is always ordered
    cost, transposed, keep = best
    if cost > MAX_PERMUTE_PIECES:
        raise RuleProblem(f"{local} <- {cname}: permute {list(perm)} of a {ext} block needs {cost:,} pieces",
                          f"at most {MAX_PERMUTE_PIECES:,}: permute fewer dims, or stack experts per expert")
    cut = [d for d in big if d not in keep]
    pieces = []
    for index in _product(*(range(*cbox[d]) for d in cut)):
        cb = list(cbox)
        for d, i in zip(cut, index):
            cb[d] = (i, i + 1)
        lb = tuple((cb[d][0] - cbox[d][0], cb[d][1] - cbox[d][0]) for d in perm)
        pieces.append(Piece(cname, tuple(cb), lb, bool(transposed)))
    return pieces


class TensorBuilder:
    """Builds local tensors; the expander provides ``cfg``, ``model``, ``sizes``, ``_dominant`` and ``int_expr``."""

    cfg: Any
    model: CanonicalModel
    sizes: dict[str, int]
    _dominant: str | None

    def int_expr(self, expr: int | str) -> int:  # pragma: no cover - provided by the expander
        raise NotImplementedError

    def _expert_range(self, axis: str | None, coords: Mapping[str, int], rule: Rule) -> tuple[int, int]:
        count = self.int_expr(rule.stack.count if rule.stack else "num_experts")
        if axis is None:
            return 0, count
        size = self._axis_size(axis)
        if rule.stack is not None and rule.stack.uneven:  # torch.chunk: ceil-sized, trailing ones short or empty
            per = -(-count // size)
            return min(coords[axis] * per, count), min((coords[axis] + 1) * per, count)
        if count % size:
            raise RuleProblem(f"{count} experts are not divisible by {axis}={size}", f"choose {axis} dividing {count}", axis=axis)
        per = count // size
        return coords[axis] * per, (coords[axis] + 1) * per

    def _axis_size(self, axis: str, field: str = "") -> int:
        if axis not in self.sizes:
            raise RuleProblem(f"unknown mesh axis {axis!r}", f"axes of this side: {', '.join(sorted(self.sizes))}", field=field)
        return self.sizes[axis]

    def _dtype(self, rule: Rule, canonical: str) -> str:
        raw = rule.dtype or self.cfg.dtype
        if raw is None or raw == "canonical":
            return self.model[canonical].dtype
        if raw == "model":
            return self.cfg.dtype or self._model_dtype()
        dt = normalize_dtype(raw)
        if dt is None:
            raise RuleProblem(f"unknown dtype {raw!r}", "use e.g. bfloat16, float16, float32", field="dtype")
        return dt

    def _model_dtype(self) -> str:
        """The floating dtype holding most canonical elements (the config's torch_dtype in practice)."""
        if self._dominant is None:
            totals: dict[str, int] = defaultdict(int)
            for t in self.model.tensors:
                if t.dtype.startswith(("float", "bfloat")):
                    totals[t.dtype] += prod(t.shape)
            self._dominant = max(sorted(totals), key=lambda d: totals[d]) if totals else "float32"
        return self._dominant

    def _build(self, rule: Rule, b: Binding, coords: Mapping[str, int], name: str) -> LocalTensor | None:
        if rule.stack is None:
            shape, pieces = self._body(rule, b.names[0], coords, name)
        else:
            first, stop = self._expert_range(rule.stack.axis, coords, rule)
            items = [(e, n) for e, n in zip(b.experts, b.names) if first <= e < stop]
            if not items:
                return None
            shape, pieces = None, []
            same: dict[tuple, tuple[tuple[int, ...], tuple[tuple, ...]]] = {}
            for e, names in items:
                item_shape, item_pieces = self._stack_item(rule, names, coords, name, same)
                if shape is not None and item_shape != shape:
                    raise RuleProblem(f"{name}: experts have different shapes {shape} and {item_shape}")
                shape = item_shape
                i = e - first
                pieces.extend(Piece(p.canonical, p.canonical_box, ((i, i + 1), *p.local_box), p.transpose)
                              for p in item_pieces)
            shape = (stop - first, *shape)
        dtype = self._dtype(rule, b.names[0][0])
        tensor = LocalTensor(name, tuple(shape), dtype, tuple(pieces))
        if not any(p.pad for p in rule.parts()) and sum(p.numel for p in pieces) != tensor.numel:
            raise RuleProblem(f"{name}: pieces cover {sum(p.numel for p in pieces)} of {tensor.numel} elements")
        return tensor

    def _stack_item(self, rule: Rule, names: list[str], coords: Mapping[str, int], local: str,
                    same: dict[tuple, tuple[tuple[int, ...], tuple[tuple, ...]]]) -> tuple[tuple[int, ...], Sequence[Piece]]:
        """One stacked expert's shape and pieces (in its own frame). Experts whose canonical tensors
        have the same shapes and dtypes get the same boxes (``same`` holds them for one stacked
        tensor): built once, then only the names are filled in (a vLLM rank at TP 32 stacks all 256
        experts of a layer)."""
        if len(set(names)) != len(names):  # a tensor named twice: which piece is which is ambiguous
            return self._body(rule, names, coords, local)
        sig = tuple(self.model[n][1:] for n in names)
        hit = same.get(sig)
        if hit is not None:
            return hit[0], named_pieces(hit[1], names)
        item_shape, item_pieces = self._body(rule, names, coords, local)
        same[sig] = (item_shape, relative_pieces(item_pieces, names))
        return item_shape, item_pieces

    def _body(self, rule: Rule, names: list[str], coords: Mapping[str, int], local: str) -> tuple[tuple[int, ...], list[Piece]]:
        parts = rule.parts()
        if rule.interleave is not None:
            return self._interleave(rule, parts, names, coords, local)
        dim = rule.concat.dim if rule.concat is not None else 0
        shape: list[int] | None = None
        pieces: list[Piece] = []
        for k, (part, cname) in enumerate(zip(parts, names)):
            field = f"concat.parts[{k}]" if rule.concat is not None else ""
            block, part_pieces = self._part(part, cname, coords, local, field)
            if shape is None:
                shape = list(block)
                offset = 0
            else:
                if len(block) != len(shape) or dim >= len(block) or any(
                    x != y for d, (x, y) in enumerate(zip(block, shape)) if d != dim
                ):
                    raise RuleProblem(
                        f"{local}: concat parts disagree outside dim {dim}: {tuple(shape)} vs {block}",
                        "every part of a concat must have the same shape except along the concat dim",
                        field=field,
                    )
                offset = shape[dim]
                shape[dim] += block[dim]
            for piece in part_pieces:
                if offset:
                    lb = list(piece.local_box)
                    lb[dim] = (lb[dim][0] + offset, lb[dim][1] + offset)
                    piece = piece._replace(local_box=tuple(lb))
                pieces.append(piece)
        assert shape is not None
        return tuple(shape), pieces

    def _part(self, part: Part, cname: str, coords: Mapping[str, int], local: str, field: str) -> tuple[tuple[int, ...], list[Piece]]:
        """A part's local block shape and its pieces (none when the rank holds only padding).

        Canonical frame: ``window`` starts as the slice of the tensor, is padded (the padded extent
        maps to nothing: ``limit`` is where the data ends) and sharded; the block is then
        permuted (or transposed) into the local frame, with the pieces' local boxes relative to
        the block's origin."""
        cshape = self.model[cname].shape
        window = [(0, n) for n in cshape]
        for j, op in enumerate(part.slice):
            where = f"{field}.slice[{j}]".lstrip(".")
            if op.dim >= len(window):
                raise RuleProblem(f"{cname}: slice dim {op.dim} out of range for shape {cshape}", field=where)
            lo, hi = window[op.dim]
            start = self.int_expr(op.start)
            stop = hi - lo if op.stop is None else self.int_expr(op.stop)
            if not 0 <= start < stop <= hi - lo:
                raise RuleProblem(f"{cname}: slice [{start}:{stop}] of dim {op.dim} is not inside its extent {hi - lo}",
                                  "start < stop <= the dim's size (after earlier slices of it)", field=where)
            window[op.dim] = (lo + start, lo + stop)
        limit = [hi for _, hi in window]
        if part.pad is not None:
            d = part.pad.dim
            if d >= len(window):
                raise RuleProblem(f"{cname}: pad dim {d} out of range for shape {cshape}", field=f"{field}.pad".lstrip("."))
            m = self.int_expr(part.pad.multiple)
            lo, hi = window[d]
            window[d] = (lo, lo + -(-(hi - lo) // m) * m)
        for j, op in enumerate(part.shard):
            if op.dim >= len(window):
                raise RuleProblem(f"{cname}: shard dim {op.dim} out of range for shape {cshape}", field=f"{field}.shard[{j}]".lstrip("."))
            size = self.sizes.get(op.axis) or self._axis_size(op.axis, f"{field}.shard[{j}].axis".lstrip("."))
            blocks = self.int_expr(op.blocks) if op.blocks is not None else None
            lo, hi = window[op.dim]
            window[op.dim] = chunk_window(lo, hi, op, size, coords.get(op.axis, 0), blocks, f"{local} <- {cname}")
        block = tuple(hi - lo for lo, hi in window)
        cbox = tuple((lo, min(hi, n)) for (lo, hi), n in zip(window, limit))
        empty = any(b <= a for a, b in cbox)
        if part.transpose:
            if len(block) != 2:
                raise RuleProblem(f"{cname}: transpose needs a 2-D tensor, got shape {cshape}",
                                  "use permute for more dims", field=field)
            pieces = [] if empty else [Piece(cname, cbox, tuple((0, b - a) for a, b in cbox)[::-1], True)]
            return block[::-1], pieces
        if part.permute is not None:
            perm = tuple(part.permute)
            if len(perm) != len(block):
                raise RuleProblem(f"{cname}: permute {list(perm)} has {len(perm)} dims, the tensor {len(block)} {cshape}",
                                  field=f"{field}.permute".lstrip("."))
            return tuple(block[d] for d in perm), ([] if empty else permuted_pieces(cname, cbox, perm, local))
        return block, ([] if empty else [Piece(cname, cbox, tuple((0, b - a) for a, b in cbox), False)])

    def _interleave(self, rule: Rule, parts: list[Part], names: list[str], coords: Mapping[str, int], local: str) -> tuple[tuple[int, ...], list[Piece]]:
        spec = rule.interleave
        assert spec is not None
        dim = spec.dim
        groups = self.int_expr(spec.groups)
        rows = []
        other: tuple[int, ...] | None = None
        for k, cname in enumerate(names):
            shape = self.model[cname].shape
            if parts[k].shard or parts[k].pad or parts[k].transpose or parts[k].slice or parts[k].permute is not None:
                raise RuleProblem(f"{local}: interleave parts take no slice/shard/pad/transpose/permute",
                                  field=f"interleave.parts[{k}]")
            if dim >= len(shape) or groups <= 0 or shape[dim] % groups:
                raise RuleProblem(f"{local}: dim {dim} of {cname} {shape} does not split into {groups} groups", field="interleave.groups")
            rest = shape[:dim] + shape[dim + 1 :]
            if other is not None and rest != other:
                raise RuleProblem(f"{local}: interleave parts disagree outside dim {dim}", field=f"interleave.parts[{k}]")
            other = rest
            rows.append(shape[dim] // groups)
        g0, g1 = 0, groups
        if spec.axis is not None:
            op = ShardOp(dim=dim, axis=spec.axis, blocks=groups)  # whole groups per rank, never replicated
            g0, g1 = chunk_window(0, groups, op, self._axis_size(spec.axis), coords.get(spec.axis, 0), groups, f"{local} groups")
        per_group = sum(rows)
        pieces = []
        for i, g in enumerate(range(g0, g1)):
            off = i * per_group
            for cname, r in zip(names, rows):
                full = self.model[cname].shape
                cbox = tuple((g * r, (g + 1) * r) if d == dim else (0, n) for d, n in enumerate(full))
                lbox = tuple((off, off + r) if d == dim else (0, n) for d, n in enumerate(full))
                pieces.append(Piece(cname, cbox, lbox, False))
                off += r
        assert other is not None
        shape = list(other)
        shape.insert(dim, (g1 - g0) * per_group)
        return tuple(shape), pieces
