"""Expand rules x mesh -> per-rank layout IR. Deterministic; pure (no torch).

Call sequence (any process, no process group): build a :class:`SideConfig`, call
:func:`expand_side` with the :class:`~weightbridge.layout.ir.CanonicalModel`; get
a :class:`~weightbridge.layout.ir.SideLayout` and every problem found (all of
them, not the first).

Binding rule templates to canonical names (once per side) is here; building one rank's local
tensor from a binding is :mod:`weightbridge.layout.local_build` (the expander's base class).

Frames: shard windows are in the *virtual* frame of a part (its canonical shape
after padding); pieces clip them to the canonical shape, and their local boxes are
in the frame of the local tensor being built.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weightbridge.layout.expr import ExprError, evaluate, evaluate_int
from weightbridge.layout.ir import CanonicalModel, LocalTensor, RankLayout, SideLayout, checkpoint_casts
from weightbridge.layout.local_build import Binding, RuleProblem, TensorBuilder, named_pieces, relative_pieces
from weightbridge.layout.mesh import CUSTOM, MeshFamily, stage_layers
from weightbridge.layout.model_facts import LAYER, model_facts
from weightbridge.layout.rule_axes import axes_used, coordinate_sensitive, rule_axes
from weightbridge.layout.rules import Rule
from weightbridge.layout.templates import CanonicalPattern, Filler, TemplateError

# Params every model has for rule expressions, when the canonical source says nothing.
PARAM_DEFAULTS: dict[str, Any] = {
    "num_experts": 0,
    "num_shared_experts": 0,
    "first_k_dense": 0,
    "q_lora_rank": 0,
    "kv_lora_rank": 0,
    "tie_word_embeddings": False,
}


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


@dataclass
class _CompiledRule:
    rule: Rule
    origin: Origin
    bindings: list[Binding]
    by_layer: dict[int | None, list[Binding]] = field(default_factory=dict)  # each list sorted by expert
    experts: dict[int | None, list[int]] = field(default_factory=dict)  # parallel to by_layer, for bisect
    axes: tuple[str, ...] = field(init=False)  # the mesh axes the rule's geometry depends on
    local: Filler = field(init=False)

    def __post_init__(self) -> None:
        self.axes = tuple(sorted({axis for axis, _ in rule_axes(self.rule)}))
        self.local = Filler.of(self.rule.local)
        for b in self.bindings:
            self.by_layer.setdefault(b.layer, []).append(b)
        for layer, binds in self.by_layer.items():
            binds.sort(key=lambda b: b.values.get("expert", -1))
            self.experts[layer] = [b.values.get("expert", -1) for b in binds]


class _Expander(TensorBuilder):
    def __init__(self, cfg: SideConfig, model: CanonicalModel) -> None:
        self.cfg = cfg
        self.model = model
        self.facts = facts = model_facts(model)
        self.problems: list[ExpandProblem] = []
        self._seen: set[ExpandProblem] = set()
        self.sizes = cfg.family.sizes(cfg.mesh)
        self.names: dict[str, Any] = {**PARAM_DEFAULTS, **model.param_dict, **cfg.params, **self.sizes}
        self.names.setdefault("num_layers", facts.num_layers)
        self.compiled: list[_CompiledRule] = []
        self._int_cache: dict[str, int] = {}
        self._geometry: dict[tuple, tuple] = {}  # see _build_shared
        self._shape_keys: dict[int, tuple] = {}  # id(binding) -> (its names, their shapes and dtypes or None)
        self.clones: dict[int, LocalTensor] | None = None  # see expand_side
        self._dominant: str | None = None
        self._all_layers: list[int | None] = facts.layers

    def problem(self, msg: str, hint: str = "", origin: Origin | None = None, axis: str = "", field: str = "") -> None:
        p = ExpandProblem(msg, hint, origin, axis, field)
        if p not in self._seen:  # a set: a failing rule reports once per binding (10^4 of them)
            self._seen.add(p)
            self.problems.append(p)

    # ---- rank-independent: match templates ------------------------------------------------
    def check_axes(self) -> set[int]:
        """Report every mesh axis a rule names that this side does not have (each at its field);
        returns the positions (in ``cfg.rules``) of the rules naming one."""
        bad: set[int] = set()
        custom = self.cfg.family.name == CUSTOM
        declared = self.cfg.family.sizes({})  # the family's axes, not whatever the mesh names
        for i, (rule, origin) in enumerate(self.cfg.rules):
            for axis, fld in rule_axes(rule):
                if axis in declared:
                    continue
                bad.add(i)
                if custom:
                    hint = f"declare it in the side's axes: (now {', '.join(self.cfg.family.user_axes) or 'none'})"
                else:
                    hint = f"axes of this side: {', '.join(sorted(declared))}"
                self.problem(f"unknown mesh axis {axis!r}", hint, origin, field=fld)
        return bad

    def compile_rules(self, skip: Collection[int] = ()) -> None:
        consumed: set[str] = set()
        fallbacks: list[tuple[Rule, Origin]] = []
        for i, (rule, origin) in enumerate(self.cfg.rules):
            if i in skip:
                continue
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
            binds = [Binding({"*": n}, [[n]], [], self._layer_of(n)) for n in rest]
            self.compiled.append(_CompiledRule(rule, origin, binds))
            consumed.update(rest)

    def _layer_of(self, name: str) -> int | None:
        m = LAYER.search(name)
        return int(m.group(1)) if m else None

    def _bind(self, rule: Rule) -> list[Binding]:
        parts = rule.parts()
        first = CanonicalPattern.compile(parts[0].canonical)
        for p in parts[1:]:
            CanonicalPattern.compile(p.canonical)  # validates variables
        for template in [*rule.requires, *rule.unless]:
            CanonicalPattern.compile(template)  # validates variables; existence is checked by name below
        stacked = rule.stack is not None
        groups: dict[tuple[tuple[str, int], ...], list[tuple[dict[str, int], list[str]]]] = defaultdict(list)
        matches = self.facts.matches(first, tuple(p.canonical for p in parts), tuple(rule.requires), tuple(rule.unless))
        for values, names in matches:
            if stacked and "expert" not in values:
                raise TemplateError(f"stacked rule {rule.local!r}: canonical template needs {{expert}}")
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
                out.append(Binding(values, [m[1] for m in members], [m[0]["expert"] for m in members], layer))
            else:
                out.append(Binding(values, [members[0][1]], [], layer))
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

    def expand_rank(self, coords: Mapping[str, int], stage: int, layers: range,
                    only: Collection[int] | None = None) -> tuple[LocalTensor, ...]:
        """The rank's local tensors (sorted by name); ``only``: positions in ``compiled`` of the rules
        to expand (the others are skipped: a problem search, see :func:`expand_side`)."""
        pp = self.sizes.get("pp", 1)
        out: dict[str, LocalTensor] = {}
        wanted_layers = [None, *layers] if pp > 1 else list(self._all_layers)
        for i, cr in enumerate(self.compiled):
            if only is not None and i not in only:
                continue
            rule = cr.rule
            try:
                expert_window = None
                if rule.stack is None and any("expert" in b.values for b in cr.bindings[:1]):
                    expert_window = self._expert_range(rule.expert_axis, coords, rule)
            except RuleProblem as exc:
                self.problem(exc.message, exc.hint, cr.origin, exc.axis, exc.field)
                continue
            except ExprError as exc:
                self.problem(str(exc), origin=cr.origin)
                continue
            at = (id(cr), tuple(coords.get(a, 0) for a in cr.axes))  # the rank, as the rule's geometry sees it
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
                    name, tensor = self._instantiate(cr, b, coords, at, layers, pp, expert_window)
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
        self, cr: _CompiledRule, b: Binding, coords: Mapping[str, int], at: tuple, layers: range, pp: int,
        expert_window: tuple[int, int] | None,
    ) -> tuple[str, LocalTensor | None]:
        values: dict[str, Any] = dict(b.values)
        if b.layer is not None:
            values.setdefault("layer", b.layer)
            values["local_layer"] = b.layer - layers.start if pp > 1 else b.layer
        if expert_window is not None:
            values["local_expert"] = values["expert"] - expert_window[0]
        try:
            name = cr.local(values)
            return name, self._build_shared(cr, b, coords, at, name)
        except RuleProblem as exc:
            self.problem(exc.message, exc.hint, cr.origin, exc.axis, exc.field)
        except (ExprError, TemplateError) as exc:
            self.problem(str(exc), origin=cr.origin)
        return "", None

    def _build_shared(self, cr: _CompiledRule, b: Binding, coords: Mapping[str, int], at: tuple,
                      name: str) -> LocalTensor | None:
        """:meth:`_build`, reusing an earlier result's geometry: a binding of the same rule at the same
        coordinates (on the rule's axes) whose canonical tensors have the same shapes and dtypes
        (every layer's ``q_proj``, every expert's gate/up pair on this rank, every layer's stacked
        experts) gets the same shape, dtype and boxes; only the canonical names differ. Bindings
        naming one tensor twice are built in full. ``at``: the rule and the rank's coordinates on
        its axes (a stacked rule's expert window is one of them)."""
        known = self._shape_keys.get(id(b))
        if known is None:  # once per binding: its names (every stacked expert's), their shapes and dtypes
            names = [n for per_expert in b.names for n in per_expert]
            shapes = (tuple(b.experts), tuple(self.model[n][1:] for n in names)) if len(set(names)) == len(names) else None
            known = self._shape_keys[id(b)] = (names, shapes)
        names, shapes = known
        if shapes is None:  # a tensor named twice: which piece is which name is ambiguous
            return self._build(cr.rule, b, coords, name)
        key = (at, shapes)
        hit = self._geometry.get(key)
        if hit is None:
            t = self._build(cr.rule, b, coords, name)
            if t is not None:
                self._geometry[key] = (t.shape, t.dtype, relative_pieces(t.pieces, names))
            return t
        shape, dtype, geometry = hit
        t = LocalTensor(name, shape, dtype, named_pieces(geometry, names))
        if self.clones is not None:
            self.clones[id(t)] = t
        return t

    def _on_stage(self, rule: Rule, b: Binding, stage: int, pp: int) -> bool:
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


def expand_side(cfg: SideConfig, model: CanonicalModel,
                clones: dict[int, LocalTensor] | None = None) -> tuple[SideLayout, list[ExpandProblem]]:
    """Expand one side into per-rank layouts; returns every problem found.

    ``clones``, when given, receives (by ``id``, kept alive there) every local tensor whose geometry
    was copied from an earlier one (:meth:`_Expander._build_shared`): it tiles exactly when that one does, so a
    tiling check may skip it while the others pass (:func:`weightbridge.spec.sides.side_pass`)."""
    ex = _Expander(cfg, model)
    if clones is not None:
        ex.clones = clones
    mesh_problems = cfg.family.check(cfg.mesh)
    for mp in mesh_problems:
        ex.problem(mp.message, mp.hint, axis=mp.axis)
    bad_rules = ex.check_axes()
    if mesh_problems:
        return SideLayout(cfg.side, (), cfg.instances), ex.problems
    ex.compile_rules(skip=bad_rules)
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
    used_axes = sorted(axes_used(cfg.rules) | {"pp"})
    all_coords = [cfg.family.coords(cfg.mesh, r) for r in range(per_instance)]
    cache: dict[tuple[int, ...], tuple[LocalTensor, ...]] = {}

    def expand(coords: dict[str, int], only: Collection[int] | None = None) -> tuple[LocalTensor, ...]:
        stage = coords.get("pp", 0)
        return ex.expand_rank(coords, stage, stages[stage] if stages else range(0), only)

    # Sizes are refused before the full expansion: first the representative ranks (the first rank of
    # each pipeline stage and expert slice: together they hold every binding), where every problem
    # that does not depend on the rank's shard coordinates shows. Problems there refuse the side; the
    # other ranks are searched only with the rules whose problems can depend on those coordinates.
    keys = [tuple(coords.get(a, 0) for a in used_axes) for coords in all_coords]
    selectors = sorted(_selector_axes(ex.compiled) | {"pp"})
    seen: set[tuple[int, ...]] = set()
    for coords, key in zip(all_coords, keys):
        selector = tuple(coords.get(a, 0) for a in selectors)
        if selector not in seen:
            seen.add(selector)
            if key not in cache:
                cache[key] = expand(coords)
    if ex.problems:
        sensitive = {i for i, cr in enumerate(ex.compiled) if coordinate_sensitive(cr.rule)}
        searched: set[tuple[int, ...]] = set(cache)
        for coords, key in zip(all_coords, keys):
            if sensitive and key not in searched:
                searched.add(key)
                expand(coords, sensitive)
        return SideLayout(cfg.side, (), cfg.instances), ex.problems
    template: list[tuple[dict[str, int], tuple[LocalTensor, ...]]] = []
    for coords, key in zip(all_coords, keys):
        if key not in cache:
            cache[key] = expand(coords)
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
    casts = checkpoint_casts(model, ranks) if cfg.side == "rollout" else ()
    return SideLayout(cfg.side, tuple(ranks), cfg.instances, casts), ex.problems


def _selector_axes(compiled: Sequence[_CompiledRule]) -> set[str]:
    """The mesh axes whose coordinate selects which bindings a rank holds (besides ``pp``): the
    axis owning ``{expert}`` of each rule binding experts (stacked or not)."""
    axes: set[str] = set()
    for cr in compiled:
        rule = cr.rule
        if rule.stack is not None:
            if rule.stack.axis:
                axes.add(rule.stack.axis)
        elif any("expert" in b.values for b in cr.bindings[:1]):
            axes.add(rule.expert_axis)
    return axes
