"""Passes 5 and 6 of :mod:`weightbridge.spec.resolve`, per side, and the size limits of a spec.

:func:`side_config` merges a side's preset with its spec overrides; :func:`side_pass` expands it
(:func:`weightbridge.layout.expand.expand_side`), places every expansion problem at its JSON path,
checks tiling, pins and coverage. :func:`world_problem` and :func:`round_bytes_problem` refuse
specs whose expansion or planning would not end in seconds. Pure (no torch).
"""

from __future__ import annotations

from weightbridge.layout.coverage import tiling_problems, uncovered
from weightbridge.layout.expand import ExpandProblem, Origin, SideConfig, expand_side
from weightbridge.layout.ir import CanonicalModel, LocalTensor, SideLayout
from weightbridge.layout.mesh import custom_family
from weightbridge.layout.normalize import layout_fingerprint
from weightbridge.layout.presets import load_preset, merge_rules
from weightbridge.layout.templates import skeleton
from weightbridge.spec.errors import SpecProblem
from weightbridge.spec.models import NO_PRESET, SideSpec, Spec
from weightbridge.spec.yaml_source import YamlSource, child_path


class Collector:
    """Every problem of one spec text, each at its JSON path and line; which sections were rejected."""

    def __init__(self, src: YamlSource) -> None:
        self.src = src
        self.problems: list[SpecProblem] = []
        self.bad_paths: list[str] = []

    def add(self, path: str, message: str, hint: str = "", line: int | None = None) -> None:
        p = SpecProblem(path, message, hint, self.src.file, line if line is not None else self.src.line_of(path))
        if p not in self.problems:
            self.problems.append(p)
        self.bad_paths.append(path)

    def section_ok(self, path: str) -> bool:
        return not any(b == path or b.startswith(path + ".") or b.startswith(path + "[") for b in self.bad_paths)


# ---- pass 5 + 6: expansion and coverage ------------------------------------------------------


def side_config(side: str, spec_side: SideSpec) -> SideConfig:
    """Merge a side's preset with its spec overrides (``preset: none``: the spec's rules on its own axes)."""
    if spec_side.preset == NO_PRESET:
        family, pp_style, first, last = custom_family(spec_side.axes or ()), "even", frozenset(), frozenset()
        if spec_side.mesh_family is not None:  # that preset's numbering, derived axes and stages; none of its rules
            borrowed = load_preset(spec_side.mesh_family)
            family, pp_style = borrowed.family, borrowed.pp_style
            first, last = frozenset(borrowed.pipeline.first), frozenset(borrowed.pipeline.last)
        return SideConfig(
            side=side,
            family=family,
            mesh=dict(spec_side.mesh),
            rules=[(r, Origin("spec", i)) for i, r in enumerate(spec_side.rules)],
            params=dict(spec_side.params),
            instances=spec_side.instances,
            dtype=spec_side.dtype,
            first_stage=first,
            last_stage=last,
            pp_style=pp_style,
            pipeline_layers=tuple(spec_side.pipeline.layers) if spec_side.pipeline else None,
        )
    preset = load_preset(spec_side.preset)
    merged = merge_rules(preset.rules, spec_side.rules)
    spec_index = {id(r): i for i, r in enumerate(spec_side.rules)}
    preset_index = {id(r): i for i, r in enumerate(preset.rules)}
    rules = [
        (r, Origin("spec", spec_index[id(r)]) if id(r) in spec_index else Origin("preset", preset_index[id(r)], preset.name))
        for r in merged
    ]
    return SideConfig(
        side=side,
        family=preset.family,
        mesh=dict(spec_side.mesh),
        rules=rules,
        params={**preset.params, **spec_side.params},
        instances=spec_side.instances,
        dtype=spec_side.dtype,
        first_stage=frozenset(preset.pipeline.first),
        last_stage=frozenset(preset.pipeline.last),
        pp_style=preset.pp_style,
        pipeline_layers=tuple(spec_side.pipeline.layers) if spec_side.pipeline else None,
    )


def side_pass(side: str, spec_side: SideSpec, model: CanonicalModel, col: Collector) -> SideLayout | None:
    cfg = side_config(side, spec_side)
    clones: dict[int, LocalTensor] = {}
    layout, problems = expand_side(cfg, model, clones)
    by_path: dict[str, list[ExpandProblem]] = {}
    for p in problems:
        path, _ = _locate(side, spec_side, cfg, p)
        by_path.setdefault(path, []).append(p)
    for path, group in by_path.items():
        _, message = _locate(side, spec_side, cfg, group[0])
        if len(group) > 1:
            message += f" (and {len(group) - 1} more problem(s) here)"
        hint, axis = group[0].hint, group[0].axis
        if axis and axis not in spec_side.mesh and axis in cfg.family.sizes({}):  # a size the spec never wrote
            how = f", as `weightbridge presets {spec_side.preset}` says" if spec_side.preset != NO_PRESET else ""
            hint += f"{'; ' if hint else ''}{axis} is not in the mesh: its size follows from the others{how}"
        col.add(path, message, hint)
    if problems:
        return None
    found = _tiling(layout, model, skip=clones)
    if found and clones:  # report every tensor's own problems, in order, as a full pass would
        found = _tiling(layout, model, skip={})
    for msg in found:
        col.add(f"$.{side}", msg)
    _check_pins(side, spec_side, layout, col)
    groups = [layout.ranks] if side == "trainer" else [layout.instance_ranks(0)]
    for ranks in groups:
        missing = uncovered(model, ranks)
        if missing:
            col.add(
                f"$.{side}.preset",
                f"{len(missing)} canonical tensor(s) held by no {side} rank: {_summarize(missing)}",
                f"add rules under {side}.rules for them (weightbridge explain shows what each rank holds)"
                + ("; {local: '{*}', canonical: '{*}'} keeps the rest whole" if spec_side.preset == NO_PRESET else ""),
            )
    return layout


def _tiling(layout: SideLayout, model: CanonicalModel, skip: dict[int, LocalTensor]) -> list[str]:
    """Tiling problems of every distinct local tensor but those in ``skip`` (ids of geometry copies:
    they tile exactly when their original does), each naming its rank."""
    out: list[str] = []
    seen: set[int] = set()
    for r in layout.ranks:
        if id(r.tensors) in seen:
            continue
        seen.add(id(r.tensors))
        for t in r.tensors:
            if id(t) not in skip:
                out.extend(f"rank {r.rank}: {msg}" for msg in tiling_problems(t, model))
    return out


def _check_pins(side: str, spec_side: SideSpec, layout: SideLayout, col: Collector) -> None:
    """Pinned fingerprints must equal the expansion's (ranks of instance 0 on the rollout side)."""
    ranks = layout.ranks if side == "trainer" else tuple(sorted(layout.instance_ranks(0), key=lambda r: r.local_rank))
    for rank, pinned in spec_side.pins.items():
        if rank >= len(ranks):
            col.add(child_path(f"$.{side}.pins", rank), f"rank {rank} out of range: the {side} has ranks 0..{len(ranks) - 1}",
                    "pin ranks of one instance (rollout) or of the whole trainer")
            continue
        actual = layout_fingerprint(ranks[rank])
        if actual != pinned:
            col.add(
                child_path(f"$.{side}.pins", rank),
                f"the spec now expands rank {rank} to layout {actual}, not the pinned {pinned}",
                "a preset or rule changed: compare with `weightbridge diff` against the probe output, then re-pin",
            )


def _locate(side: str, spec_side: SideSpec, cfg: SideConfig, p: ExpandProblem) -> tuple[str, str]:
    base = f"$.{side}"
    o = p.origin
    if o is not None and o.kind == "spec":
        path = f"{base}.rules[{o.index}]"
        if p.field:
            path += "." + p.field
        return path, p.message
    where = ""
    if o is not None:
        rule = load_preset(o.preset).rules[o.index]
        where = f"preset {o.preset}, rule {rule.local!r}: "
    if p.axis:
        if p.axis in spec_side.mesh:
            return f"{base}.mesh.{p.axis}", where + p.message
        if p.axis == "pp" and spec_side.pipeline is not None:
            return f"{base}.pipeline.layers", where + p.message
        return f"{base}.mesh", where + p.message
    return (f"{base}.preset" if o is not None else base), where + p.message


def _summarize(missing: dict[str, int], limit: int = 4) -> str:
    """Missing names grouped by pattern: ``model.layers.*.mlp.gate.weight (x48)``."""
    groups: dict[str, list[str]] = {}
    for name in missing:
        groups.setdefault(skeleton(name)[0].replace("#", "*"), []).append(name)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    items = [f"{pat} (x{len(names)})" if len(names) > 1 else names[0] for pat, names in ranked[:limit]]
    more = len(ranked) - limit
    return ", ".join(items) + (f", and {more} more pattern(s)" if more > 0 else "")


# ---- planning size ---------------------------------------------------------------------------

MAX_PLAN_UNITS = 1_000_000  # pieces of round_bytes/4 the planner cuts one update into (~10 s of planning)


def round_bytes_problem(rollout: SideLayout, round_bytes: int) -> tuple[str, str] | None:
    """``(message, hint)`` when ``round_bytes`` is so small for this model that planning would not end in seconds.

    The planner cuts what the rollout ranks receive into units of at most ``round_bytes / 4``;
    their number (and the rounds' count) grows as ``bytes / round_bytes``. Used for the spec's
    ``sync.round_bytes`` and for overrides (``weightbridge plan --round-bytes``).
    """
    total = 0
    per_layout: dict[int, int] = {}
    for r in rollout.ranks:
        key = id(r.tensors)  # identical instances share their tensor tuples
        if key not in per_layout:
            per_layout[key] = sum(t.nbytes for t in r.tensors)
        total += per_layout[key]
    units = total // max(1, round_bytes // 4)
    if units <= MAX_PLAN_UNITS:
        return None
    least = 1 << max(12, (-(-total * 4 // MAX_PLAN_UNITS) - 1).bit_length())
    return (
        f"round_bytes {round_bytes} cuts one update ({total:,} bytes to the rollout ranks) into ~{units:,} pieces; "
        f"the planner takes at most {MAX_PLAN_UNITS:,}",
        f"use round_bytes >= {least} (typical: 64MiB to 2GiB)",
    )


MAX_WORLD = 1 << 16  # ranks per side; expansion and planning are linear in ranks (dp: 10**9 never ends)


def world_problem(side: str, spec_side: SideSpec) -> tuple[str, str, str] | None:
    """``(path, message, hint)`` when a side has more than MAX_WORLD ranks (instances x ranks per instance)."""
    cfg = side_config(side, spec_side)
    try:
        per_instance = cfg.family.world_size(cfg.mesh)
    except (KeyError, ValueError, TypeError):  # expansion reports a malformed mesh with its location
        return None
    total = per_instance * cfg.instances
    if total <= MAX_WORLD:
        return None
    path = f"$.{side}.instances" if per_instance <= MAX_WORLD else f"$.{side}.mesh"
    return (
        path,
        f"{total:,} ranks ({cfg.instances:,} instance(s) x {per_instance:,}); "
        f"weightbridge lays out at most {MAX_WORLD:,} per side",
        "check the mesh sizes and instances",
    )


def unchecked_sides(spec: Spec) -> list[str]:
    """A warning per side whose layout nothing live has confirmed: it has no ``pins`` (the layout
    fingerprints ``weightbridge probe`` prints after probing that side's own loader). Such a layout
    is the preset's (and the rules') description of the framework, which a live system may
    contradict (another layer spec, fused experts, engine padding): a spec that validates can still
    be wrong. Pure (no torch); the spec must have resolved."""
    out = []
    for name in ("trainer", "rollout"):
        side = getattr(spec, name)
        if not side.pins:
            what = f"the {side.preset} preset" + (" and its rules" if side.rules else "") if side.preset != NO_PRESET \
                else "its rules"
            out.append(f"{name}: layout from {what}, never checked against a live loader (no {name}.pins): run "
                       f"`weightbridge probe SPEC --loader MODULE:FACTORY --side {name} --rank R -o probe.json "
                       f"--check` (or the conformance suite) and pin the fingerprint it prints")
    return out
