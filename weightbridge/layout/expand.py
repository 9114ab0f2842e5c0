"""Expand rules x mesh -> per-rank layout IR. Deterministic; pure (no torch).

Call sequence (any process, no process group): build a :class:`SideConfig`, call
:func:`expand_side` with the :class:`~weightbridge.layout.ir.CanonicalModel`; get
a :class:`~weightbridge.layout.ir.SideLayout` and every problem found (all of
them, not the first).

Frames: shard windows are in the *virtual* frame of a part (its canonical shape
after padding); pieces clip them to the canonical shape, and their local boxes are
in the frame of the local tensor being built.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from math import prod
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weightbridge.layout.expr import ExprError, evaluate, evaluate_int
from weightbridge.layout.ir import CanonicalModel, LocalTensor, Piece, RankLayout, SideLayout, normalize_dtype
from weightbridge.layout.mesh import MeshFamily, stage_layers
from weightbridge.layout.rules import Part, Rule, ShardOp
from weightbridge.layout.templates import CanonicalPattern, NameIndex, TemplateError, fill

# Params every model has for rule expressions, when the canonical source says nothing.
PARAM_DEFAULTS: dict[str, Any] = {
    "num_experts": 0,
    "num_shared_experts": 0,
    "first_k_dense": 0,
    "q_lora_rank": 0,
    "kv_lora_rank": 0,
    "tie_word_embeddings": False,
}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Origin:
    """Where a rule came from, for error paths: a preset's rule list or the spec's."""

    kind: str  # "preset" | "spec"
    index: int
    preset: str = ""


@dataclass(frozen=True)
class ExpandProblem:
    """One problem found while expanding. ``origin`` None = about the side as a whole."""

    message: str
    hint: str = ""
    origin: Origin | None = None
    axis: str = ""  # the mesh axis at fault, when there is one
    field: str = ""  # sub-path inside the rule, e.g. "concat.parts[1].shard[0]"


@dataclass(frozen=True)
class SideConfig:
    """Everything needed to expand one side, already merged (preset + spec)."""

    side: str  # "trainer" | "rollout"
    family: MeshFamily
    mesh: Mapping[str, int]
    rules: Sequence[tuple[Rule, Origin]]
    params: Mapping[str, Any] = field(default_factory=dict)  # preset params updated by spec params
    instances: int = 1
    dtype: str | None = None
    first_stage: frozenset[str] = frozenset()  # canonical names held by the first pipeline stage
    last_stage: frozenset[str] = frozenset()
    pp_style: str = "even"
    pipeline_layers: tuple[int, ...] | None = None


class _Problem(Exception):
    def __init__(self, message: str, hint: str = "", axis: str = "", field: str = "") -> None:
        super().__init__(message)
        self.message, self.hint, self.axis, self.field = message, hint, axis, field


@dataclass
class _Binding:
    """One instance of a rule: variable values and the canonical names of each part."""

    values: dict[str, Any]  # {layer}, {expert} values; {*} holds the whole name
    names: list[list[str]]  # per stacked expert (or one entry), per part
    experts: list[int]  # stacked experts, in order ([] when not stacked)
    layer: int | None


@dataclass
class _CompiledRule:
    rule: Rule
    origin: Origin
    bindings: list[_Binding]
    by_layer: dict[int | None, list[_Binding]] = field(default_factory=dict)  # each list sorted by expert
    experts: dict[int | None, list[int]] = field(default_factory=dict)  # parallel to by_layer, for bisect

    def __post_init__(self) -> None:
        for b in self.bindings:
            self.by_layer.setdefault(b.layer, []).append(b)
        for layer, binds in self.by_layer.items():
            binds.sort(key=lambda b: b.values.get("expert", -1))
            self.experts[layer] = [b.values.get("expert", -1) for b in binds]


def _chunk(lo: int, hi: int, op: ShardOp, size: int, coord: int, blocks: int | None, what: str) -> tuple[int, int]:
    """The window of ``coord`` when ``[lo, hi)`` is dealt over ``size`` ranks."""
    if size == 1:
        return lo, hi
    length = hi - lo
    if blocks is not None:
        if blocks <= 0 or length % blocks:
            raise _Problem(f"{what}: extent {length} of dim {op.dim} does not split into {blocks} blocks", axis=op.axis)
        unit, units = length // blocks, blocks
    else:
        unit, units = 1, length
    if units < size and blocks is not None and not op.uneven:
        if not op.replicate:
            raise _Problem(
                f"{what}: {units} blocks of dim {op.dim} are fewer than {op.axis}={size} ranks",
                f"choose {op.axis} <= {units}" + ("" if size % units else ", or set replicate: true if the framework replicates them"),
                axis=op.axis,
            )
        if size % units:
            raise _Problem(
                f"{what}: {units} blocks of dim {op.dim} cannot be replicated evenly over {op.axis}={size}",
                f"{op.axis} must divide or be a multiple of {units}",
                axis=op.axis,
            )
        idx = coord // (size // units)
        return lo + idx * unit, lo + (idx + 1) * unit
    if units % size and not op.uneven:
        raise _Problem(
            f"{what}: dim {op.dim} ({units}{' blocks' if blocks else ''}) is not divisible by {op.axis}={size}",
            f"choose {op.axis} dividing {units}",
            axis=op.axis,
        )
    per = -(-units // size)  # torch.chunk: ceil-sized chunks, trailing ones may be short or empty
    a, b = min(coord * per, units), min((coord + 1) * per, units)
    return lo + a * unit, lo + b * unit


class _Expander:
    def __init__(self, cfg: SideConfig, model: CanonicalModel) -> None:
        self.cfg = cfg
        self.model = model
        self.index = NameIndex(t.name for t in model.tensors)
        self.problems: list[ExpandProblem] = []
        self.sizes = cfg.family.sizes(cfg.mesh)
        self.names: dict[str, Any] = {**PARAM_DEFAULTS, **model.param_dict, **cfg.params, **self.sizes}
        self.names.setdefault("num_layers", self._infer_num_layers())
        self.compiled: list[_CompiledRule] = []
        self._int_cache: dict[str, int] = {}
        self._dominant: str | None = None
        self._all_layers: list[int | None] = [None, *sorted({l for t in model.tensors if (l := self._layer_of(t.name)) is not None})]

    def _infer_num_layers(self) -> int:
        layers = [int(m.group(1)) for t in self.model.tensors if (m := _LAYER.search(t.name))]
        return max(layers) + 1 if layers else 0

    def problem(self, msg: str, hint: str = "", origin: Origin | None = None, axis: str = "", field: str = "") -> None:
        p = ExpandProblem(msg, hint, origin, axis, field)
        if p not in self.problems:
            self.problems.append(p)

    # ---- rank-independent: match templates ------------------------------------------------
    def compile_rules(self) -> None:
        consumed: set[str] = set()
        fallbacks: list[tuple[Rule, Origin]] = []
        for rule, origin in self.cfg.rules:
            try:
                if rule.when is not None and not evaluate(rule.when, self.names):
                    continue
                if rule.is_fallback:
                    fallbacks.append((rule, origin))
                    continue
                bindings = self._bind(rule)
            except (ExprError, TemplateError) as exc:
                self.problem(str(exc), origin=origin)
                continue
            if not bindings and origin.kind == "spec":
                self.problem(f"rule for {rule.local!r} matches no canonical tensor", "check the canonical template", origin)
            for b in bindings:
                for names in b.names:
                    consumed.update(names)
            self.compiled.append(_CompiledRule(rule, origin, bindings))
        for rule, origin in fallbacks:
            rest = [t.name for t in self.model.tensors if t.name not in consumed]
            binds = [_Binding({"*": n}, [[n]], [], self._layer_of(n)) for n in rest]
            self.compiled.append(_CompiledRule(rule, origin, binds))
            consumed.update(rest)

    def _layer_of(self, name: str) -> int | None:
        m = _LAYER.search(name)
        return int(m.group(1)) if m else None

    def _bind(self, rule: Rule) -> list[_Binding]:
        parts = rule.parts()
        first = CanonicalPattern.compile(parts[0].canonical)
        for p in parts[1:]:
            CanonicalPattern.compile(p.canonical)  # validates variables
        for template in [*rule.requires, *rule.unless]:
            CanonicalPattern.compile(template)  # validates variables; existence is checked by name below
        stacked = rule.stack is not None
        groups: dict[tuple[tuple[str, int], ...], list[tuple[dict[str, int], list[str]]]] = defaultdict(list)
        for _name, values in self.index.match(first):
            if stacked and "expert" not in values:
                raise TemplateError(f"stacked rule {rule.local!r}: canonical template needs {{expert}}")
            names = [fill(p.canonical, values) for p in parts]
            if any(n not in self.index for n in names):
                continue
            if any(fill(t, values) not in self.index for t in rule.requires):
                continue
            if any(fill(t, values) in self.index for t in rule.unless):
                continue
            key = tuple(sorted((k, v) for k, v in values.items() if not (stacked and k == "expert")))
            groups[key].append((values, names))
        out = []
        for key, members in groups.items():
            values = dict(key)
            layer = values.get("layer")
            if layer is None:
                layer = self._layer_of(members[0][1][0])
            if stacked:
                members.sort(key=lambda m: m[0]["expert"])
                out.append(_Binding(values, [m[1] for m in members], [m[0]["expert"] for m in members], layer))
            else:
                out.append(_Binding(values, [members[0][1]], [], layer))
        out.sort(key=lambda b: (b.layer if b.layer is not None else -1, sorted(b.values.items())))
        return out

    # ---- per rank ---------------------------------------------------------------------------
    def int_expr(self, expr: int | str) -> int:
        """An integer expression over this side's names (memoised: names are fixed per side)."""
        if isinstance(expr, int):
            return expr
        if expr not in self._int_cache:
            self._int_cache[expr] = evaluate_int(expr, self.names)
        return self._int_cache[expr]

    def expand_rank(self, coords: Mapping[str, int], stage: int, layers: range) -> tuple[LocalTensor, ...]:
        pp = self.sizes.get("pp", 1)
        out: dict[str, LocalTensor] = {}
        wanted_layers = [None, *layers] if pp > 1 else list(self._all_layers)
        for cr in self.compiled:
            rule = cr.rule
            try:
                expert_window = None
                if rule.stack is None and any("expert" in b.values for b in cr.bindings[:1]):
                    expert_window = self._expert_range(rule.expert_axis, coords, rule)
            except _Problem as exc:
                self.problem(exc.message, exc.hint, cr.origin, exc.axis, exc.field)
                continue
            except ExprError as exc:
                self.problem(str(exc), origin=cr.origin)
                continue
            for layer in wanted_layers:
                binds = cr.by_layer.get(layer)
                if not binds:
                    continue
                if expert_window is not None:
                    experts = cr.experts[layer]
                    binds = binds[bisect_left(experts, expert_window[0]) : bisect_left(experts, expert_window[1])]
                for b in binds:
                    if b.layer is None and pp > 1 and not self._on_stage(rule, b, stage, pp):
                        continue
                    name, tensor = self._instantiate(cr, b, coords, layers, pp, expert_window)
                    if tensor is None:
                        continue
                    if name in out:
                        self.problem(
                            f"local tensor {name!r} is produced by two rules",
                            "give the rules different local names, or override the preset rule by repeating its local template",
                            cr.origin,
                        )
                        continue
                    out[name] = tensor
        return tuple(out[k] for k in sorted(out))

    def _instantiate(
        self, cr: _CompiledRule, b: _Binding, coords: Mapping[str, int], layers: range, pp: int, expert_window: tuple[int, int] | None
    ) -> tuple[str, LocalTensor | None]:
        values: dict[str, Any] = dict(b.values)
        if b.layer is not None:
            values.setdefault("layer", b.layer)
            values["local_layer"] = b.layer - layers.start if pp > 1 else b.layer
        if expert_window is not None:
            values["local_expert"] = values["expert"] - expert_window[0]
        try:
            name = fill(cr.rule.local, values)
            return name, self._build(cr.rule, b, coords, name)
        except _Problem as exc:
            self.problem(exc.message, exc.hint, cr.origin, exc.axis, exc.field)
        except (ExprError, TemplateError) as exc:
            self.problem(str(exc), origin=cr.origin)
        return "", None

    def _on_stage(self, rule: Rule, b: _Binding, stage: int, pp: int) -> bool:
        where = rule.stage
        if where is None:
            first_name = b.names[0][0]
            if first_name in self.cfg.first_stage:
                where = "first"
            elif first_name in self.cfg.last_stage:
                where = "last"
            else:
                where = "all"
        return where == "all" or (where == "first" and stage == 0) or (where == "last" and stage == pp - 1)

    def _expert_range(self, axis: str | None, coords: Mapping[str, int], rule: Rule) -> tuple[int, int]:
        count = self.int_expr(rule.stack.count if rule.stack else "num_experts")
        if axis is None:
            return 0, count
        size = self._axis_size(axis)
        if count % size:
            raise _Problem(f"{count} experts are not divisible by {axis}={size}", f"choose {axis} dividing {count}", axis=axis)
        per = count // size
        return coords[axis] * per, (coords[axis] + 1) * per

    def _axis_size(self, axis: str, field: str = "") -> int:
        if axis not in self.sizes:
            raise _Problem(f"unknown mesh axis {axis!r}", f"axes of this side: {', '.join(sorted(self.sizes))}", field=field)
        return self.sizes[axis]

    def _dtype(self, rule: Rule, canonical: str) -> str:
        raw = rule.dtype or self.cfg.dtype
        if raw is None or raw == "canonical":
            return self.model[canonical].dtype
        if raw == "model":
            return self.cfg.dtype or self._model_dtype()
        dt = normalize_dtype(raw)
        if dt is None:
            raise _Problem(f"unknown dtype {raw!r}", "use e.g. bfloat16, float16, float32", field="dtype")
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

    def _build(self, rule: Rule, b: _Binding, coords: Mapping[str, int], name: str) -> LocalTensor | None:
        if rule.stack is None:
            shape, pieces = self._body(rule, b.names[0], coords, name)
        else:
            first, stop = self._expert_range(rule.stack.axis, coords, rule)
            items = [(e, n) for e, n in zip(b.experts, b.names) if first <= e < stop]
            if not items:
                return None
            shape, pieces = None, []
            for e, names in items:
                item_shape, item_pieces = self._body(rule, names, coords, name)
                if shape is not None and item_shape != shape:
                    raise _Problem(f"{name}: experts have different shapes {shape} and {item_shape}")
                shape = item_shape
                i = e - first
                pieces.extend(p._replace(local_box=((i, i + 1), *p.local_box)) for p in item_pieces)
            shape = (stop - first, *shape)
        dtype = self._dtype(rule, b.names[0][0])
        tensor = LocalTensor(name, tuple(shape), dtype, tuple(pieces))
        if not any(p.pad for p in rule.parts()) and sum(p.numel for p in pieces) != tensor.numel:
            raise _Problem(f"{name}: pieces cover {sum(p.numel for p in pieces)} of {tensor.numel} elements")
        return tensor

    def _body(self, rule: Rule, names: list[str], coords: Mapping[str, int], local: str) -> tuple[tuple[int, ...], list[Piece]]:
        parts = rule.parts()
        if rule.interleave is not None:
            return self._interleave(rule, parts, names, coords, local)
        dim = rule.concat.dim if rule.concat is not None else 0
        shape: list[int] | None = None
        pieces: list[Piece] = []
        for k, (part, cname) in enumerate(zip(parts, names)):
            field = f"concat.parts[{k}]" if rule.concat is not None else ""
            block, piece = self._part(part, cname, coords, local, field)
            if shape is None:
                shape = list(block)
                offset = 0
            else:
                if len(block) != len(shape) or dim >= len(block) or any(
                    x != y for d, (x, y) in enumerate(zip(block, shape)) if d != dim
                ):
                    raise _Problem(
                        f"{local}: concat parts disagree outside dim {dim}: {tuple(shape)} vs {block}",
                        "every part of a concat must have the same shape except along the concat dim",
                        field=field,
                    )
                offset = shape[dim]
                shape[dim] += block[dim]
            if piece is not None:
                if offset:
                    lb = list(piece.local_box)
                    lb[dim] = (lb[dim][0] + offset, lb[dim][1] + offset)
                    piece = piece._replace(local_box=tuple(lb))
                pieces.append(piece)
        assert shape is not None
        return tuple(shape), pieces

    def _part(self, part: Part, cname: str, coords: Mapping[str, int], local: str, field: str) -> tuple[tuple[int, ...], Piece | None]:
        """A part's local block shape and its piece (None when the rank holds only padding)."""
        cshape = self.model[cname].shape
        virt = list(cshape)
        if part.pad is not None:
            d = part.pad.dim
            if d >= len(virt):
                raise _Problem(f"{cname}: pad dim {d} out of range for shape {cshape}", field=f"{field}.pad".lstrip("."))
            m = self.int_expr(part.pad.multiple)
            virt[d] = -(-virt[d] // m) * m
        window = [(0, n) for n in virt]
        for j, op in enumerate(part.shard):
            if op.dim >= len(window):
                raise _Problem(f"{cname}: shard dim {op.dim} out of range for shape {cshape}", field=f"{field}.shard[{j}]".lstrip("."))
            size = self._axis_size(op.axis, f"{field}.shard[{j}].axis".lstrip("."))
            blocks = self.int_expr(op.blocks) if op.blocks is not None else None
            lo, hi = window[op.dim]
            window[op.dim] = _chunk(lo, hi, op, size, coords.get(op.axis, 0), blocks, f"{local} <- {cname}")
        block = tuple(hi - lo for lo, hi in window)
        cbox = tuple((lo, min(hi, n)) for (lo, hi), n in zip(window, cshape))
        piece = None
        if not any(b <= a for a, b in cbox):
            piece = Piece(cname, cbox, tuple((0, b - a) for a, b in cbox), part.transpose)
        if part.transpose:
            if len(block) != 2:
                raise _Problem(f"{cname}: transpose needs a 2-D tensor, got shape {cshape}", field=field)
            block = block[::-1]
            if piece is not None:
                piece = piece._replace(local_box=piece.local_box[::-1])
        return block, piece

    def _interleave(self, rule: Rule, parts: list[Part], names: list[str], coords: Mapping[str, int], local: str) -> tuple[tuple[int, ...], list[Piece]]:
        spec = rule.interleave
        assert spec is not None
        dim = spec.dim
        groups = self.int_expr(spec.groups)
        rows = []
        other: tuple[int, ...] | None = None
        for k, cname in enumerate(names):
            shape = self.model[cname].shape
            if parts[k].shard or parts[k].pad or parts[k].transpose:
                raise _Problem(f"{local}: interleave parts take no shard/pad/transpose", field=f"interleave.parts[{k}]")
            if dim >= len(shape) or groups <= 0 or shape[dim] % groups:
                raise _Problem(f"{local}: dim {dim} of {cname} {shape} does not split into {groups} groups", field="interleave.groups")
            rest = shape[:dim] + shape[dim + 1 :]
            if other is not None and rest != other:
                raise _Problem(f"{local}: interleave parts disagree outside dim {dim}", field=f"interleave.parts[{k}]")
            other = rest
            rows.append(shape[dim] // groups)
        g0, g1 = 0, groups
        if spec.axis is not None:
            op = ShardOp(dim=dim, axis=spec.axis, blocks=groups)  # whole groups per rank, never replicated
            g0, g1 = _chunk(0, groups, op, self._axis_size(spec.axis), coords.get(spec.axis, 0), groups, f"{local} groups")
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


def expand_side(cfg: SideConfig, model: CanonicalModel) -> tuple[SideLayout, list[ExpandProblem]]:
    """Expand one side into per-rank layouts; returns every problem found."""
    ex = _Expander(cfg, model)
    for mp in cfg.family.check(cfg.mesh):
        ex.problem(mp.message, mp.hint, axis=mp.axis)
    if ex.problems:
        return SideLayout(cfg.side, (), cfg.instances), ex.problems
    ex.compile_rules()
    sizes = ex.sizes
    pp = sizes.get("pp", 1)
    num_layers = int(ex.names["num_layers"])
    explicit = list(cfg.pipeline_layers) if cfg.pipeline_layers is not None else None
    if explicit is not None and (len(explicit) != pp or sum(explicit) != num_layers):
        ex.problem(
            f"pipeline.layers {explicit} must have pp={pp} entries summing to num_layers={num_layers}",
            axis="pp",
        )
        explicit = None
    if explicit is None and pp > 1 and num_layers % pp and cfg.pp_style != "vllm":
        ex.problem(
            f"num_layers={num_layers} is not divisible by pp={pp}",
            "give uneven stages explicitly with pipeline: {layers: [...]}",
            axis="pp",
        )
    stages = stage_layers(num_layers, pp, explicit, cfg.pp_style)
    per_instance = cfg.family.world_size(cfg.mesh)
    used_axes = sorted(_axes_used(cfg.rules) | {"pp"})
    cache: dict[tuple[int, ...], tuple[LocalTensor, ...]] = {}
    template: list[tuple[dict[str, int], tuple[LocalTensor, ...]]] = []
    for local_rank in range(per_instance):
        coords = cfg.family.coords(cfg.mesh, local_rank)
        key = tuple(coords.get(a, 0) for a in used_axes)
        if key not in cache:
            stage = coords.get("pp", 0)
            cache[key] = ex.expand_rank(coords, stage, stages[stage] if stages else range(0))
        template.append((coords, cache[key]))
    ranks = []
    for inst in range(cfg.instances):
        for local_rank, (coords, tensors) in enumerate(template):
            ranks.append(
                RankLayout(
                    side=cfg.side,
                    rank=inst * per_instance + local_rank,
                    tensors=tensors,
                    instance=inst,
                    local_rank=local_rank,
                    coords=tuple(sorted(coords.items())),
                )
            )
    return SideLayout(cfg.side, tuple(ranks), cfg.instances), ex.problems


def _axes_used(rules: Sequence[tuple[Rule, Origin]]) -> set[str]:
    axes: set[str] = set()
    for rule, _ in rules:
        for part in rule.parts():
            axes.update(op.axis for op in part.shard)
        if rule.interleave is not None and rule.interleave.axis:
            axes.add(rule.interleave.axis)
        if rule.stack is not None and rule.stack.axis:
            axes.add(rule.stack.axis)
        axes.add(rule.expert_axis)
    return axes
