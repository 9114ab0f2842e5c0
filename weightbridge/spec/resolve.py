"""Spec file -> validated spec + canonical model + per-rank layouts, reporting every problem.

Passes, each reporting all it finds (later passes skip only sections an earlier
pass rejected):

1. YAML syntax and duplicate keys;
2. the JSON Schema (``weightbridge.spec.schema``);
3. the pydantic models, per section (cross-field checks);
4. the canonical model source;
5. rule expansion per side (mesh axes, divisibility, templates, dtypes, tiling);
6. coverage: every canonical tensor held by the trainer and by each rollout instance.

Every problem is a :class:`~weightbridge.spec.errors.SpecProblem` with file, line
and JSON path.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from weightbridge.layout.coverage import tiling_problems, uncovered
from weightbridge.layout.expand import ExpandProblem, Origin, SideConfig, expand_side
from weightbridge.layout.ir import CanonicalModel, SideLayout
from weightbridge.layout.normalize import layout_fingerprint
from weightbridge.layout.presets import load_preset, merge_rules
from weightbridge.layout.templates import skeleton
from weightbridge.plan.network import NetworkSpec
from weightbridge.spec.errors import SpecErrors, SpecProblem
from weightbridge.spec.models import BYTES_PATTERN, ModelSource, SideSpec, Spec, SyncSpec
from weightbridge.spec.schema import spec_schema
from weightbridge.spec.yaml_source import YamlSource, YamlSyntaxError, child_path, load_yaml

SIDES = ("trainer", "rollout")


@dataclass(frozen=True)
class ResolvedSpec:
    """A valid spec and everything derived from it. Built identically on every process."""

    path: str
    spec: Spec
    canonical: CanonicalModel
    trainer: SideLayout
    rollout: SideLayout
    spec_hash: str

    @property
    def sync(self) -> SyncSpec:
        return self.spec.sync

    @property
    def network(self) -> NetworkSpec | str | None:
        return self.spec.network

    def side(self, name: str) -> SideLayout:
        return self.trainer if name == "trainer" else self.rollout


class _Collector:
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


def resolve_spec(path: str | Path) -> ResolvedSpec:
    """Load, validate and expand the spec at ``path``; raise :class:`SpecErrors` listing every problem."""
    resolved, problems = check_spec(path)
    if problems or resolved is None:
        raise SpecErrors(problems)
    return resolved


def check_spec(path: str | Path) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Like :func:`resolve_spec` but returns ``(resolved or None, problems)``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        return None, [SpecProblem("$", f"cannot read spec: {exc.strerror or exc}", file=str(path))]
    return check_text(text, str(path), base_dir=path.parent)


def check_text(text: str, file: str = "<spec>", base_dir: Path | None = None) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Validate spec text; relative model paths resolve against ``base_dir`` (default: cwd)."""
    try:
        src = load_yaml(text, file)
    except YamlSyntaxError as exc:
        return None, [SpecProblem("$", str(exc), "fix the YAML syntax", file, exc.line)]
    col = _Collector(src)
    for dup_path, line in src.duplicates:
        col.add(dup_path, "duplicate key", "YAML keeps only the last one; remove the other", line)
    if not isinstance(src.data, dict):
        col.add("$", "a spec must be a mapping", "start from spec/examples/*.yaml")
        return None, col.problems
    _schema_pass(src.data, col)
    sections = _model_pass(src.data, col)
    canonical = _canonical_pass(sections.get("model"), base_dir or Path.cwd(), col)
    layouts: dict[str, SideLayout] = {}
    if canonical is not None:
        for side in SIDES:
            spec_side = sections.get(side)
            if isinstance(spec_side, SideSpec):
                lay = _side_pass(side, spec_side, canonical, col)
                if lay is not None:
                    layouts[side] = lay
    if col.problems:
        return None, sorted(col.problems, key=lambda p: (p.line or 0, p.path))
    spec = Spec.model_validate(src.data)
    spec_hash = hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
    return ResolvedSpec(file, spec, canonical, layouts["trainer"], layouts["rollout"], spec_hash), []  # type: ignore[arg-type]


# ---- pass 2: JSON Schema --------------------------------------------------------------------


def _schema_pass(data: dict[str, Any], col: _Collector) -> None:
    validator = jsonschema.Draft202012Validator(spec_schema())
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        path = "$"
        for key in err.absolute_path:
            path = child_path(path, key)
        _report_schema_error(err, path, col)


def _report_schema_error(err: jsonschema.ValidationError, path: str, col: _Collector) -> None:
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed] if isinstance(err.instance, dict) else []
        for key in extra:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            col.add(child_path(path, key), f"unknown key {key!r}", hint)
        return
    if v == "required":
        col.add(path, err.message.replace("is a required property", "is required"), "add it; see spec/examples/")
        return
    if v == "enum":
        options = [str(o) for o in err.validator_value]
        close = difflib.get_close_matches(str(err.instance), options, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "one of: " + ", ".join(options)
        col.add(path, f"{err.instance!r} is not allowed here", hint)
        return
    if v == "const":
        col.add(path, f"{err.instance!r} must be {err.validator_value!r}", "")
        return
    if v == "type":
        want = err.validator_value
        col.add(path, f"expected {want if isinstance(want, str) else ' or '.join(want)}, got {type(err.instance).__name__} {err.instance!r}")
        return
    if v in ("anyOf", "oneOf"):
        forms = err.schema.get("anyOf", []) + err.schema.get("oneOf", [])
        if any(f.get("pattern") == BYTES_PATTERN for f in forms):
            col.add(path, f"{err.instance!r} is not a byte size", "an integer or a size such as '256MiB'")
            return
        context = list(err.context or [])
        deep = [e for e in context if list(e.relative_path)]  # the branch whose type matched went deeper
        if deep:
            for sub_err in deep:
                sub = path
                for key in sub_err.relative_path:
                    sub = child_path(sub, key)
                _report_schema_error(sub_err, sub, col)
            return
        enums = [e for e in context if e.validator == "enum" and isinstance(err.instance, str)]
        if enums:
            _report_schema_error(enums[0], path, col)
            return
        # A branch of the right type failed a check; an enum of strings says nothing about a mapping.
        checks = [e for e in context if e.validator != "type" and not (e.validator in ("enum", "const") and isinstance(err.instance, dict))]
        if checks:
            _report_schema_error(checks[0], path, col)
            return
        types = sorted({str(t) for e in context if e.validator == "type" for t in ([e.validator_value] if isinstance(e.validator_value, str) else e.validator_value)})
        if types:
            col.add(path, f"expected {' or '.join(types)}, got {type(err.instance).__name__} {err.instance!r}")
            return
        col.add(path, f"{err.instance!r} does not match any allowed form")
        return
    col.add(path, err.message)


# ---- pass 3: pydantic per section ------------------------------------------------------------


def _model_pass(data: dict[str, Any], col: _Collector) -> dict[str, BaseModel]:
    out: dict[str, BaseModel] = {}
    models: dict[str, type[BaseModel]] = {"model": ModelSource, "trainer": SideSpec, "rollout": SideSpec, "sync": SyncSpec}
    if isinstance(data.get("network"), dict):
        models["network"] = NetworkSpec
    for key, cls in models.items():
        path = f"$.{key}"
        if key not in data or not col.section_ok(path):
            continue
        try:
            out[key] = cls.model_validate(data[key])
        except ValidationError as exc:
            for e in exc.errors():
                sub = path
                for part in e["loc"]:
                    sub = child_path(sub, part)
                col.add(sub, e["msg"].removeprefix("Value error, "))
    rollout = out.get("rollout")
    if isinstance(rollout, SideSpec) and rollout.preset not in ("vllm", "sglang", "hf"):
        col.add("$.rollout.preset", f"{rollout.preset!r} is a trainer preset", "rollout presets: vllm, sglang, hf")
    trainer = out.get("trainer")
    if isinstance(trainer, SideSpec) and trainer.instances != 1:
        col.add("$.trainer.instances", "the trainer is one instance", "use mesh dp for data-parallel replicas")
    return out


# ---- pass 4: canonical model -----------------------------------------------------------------


def _canonical_pass(source: BaseModel | None, base_dir: Path, col: _Collector) -> CanonicalModel | None:
    if not isinstance(source, ModelSource):
        return None
    from weightbridge.canonical import CanonicalSourceError, load_canonical

    try:
        return load_canonical(source.model_dump(exclude_none=True), base_dir)
    except CanonicalSourceError as exc:
        path = "$.model" if exc.key == "model" else f"$.model.{exc.key}"
        col.add(path, exc.message, exc.hint)
        return None


# ---- pass 5 + 6: expansion and coverage ------------------------------------------------------


def side_config(side: str, spec_side: SideSpec) -> SideConfig:
    """Merge a side's preset with its spec overrides."""
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


def _side_pass(side: str, spec_side: SideSpec, model: CanonicalModel, col: _Collector) -> SideLayout | None:
    cfg = side_config(side, spec_side)
    layout, problems = expand_side(cfg, model)
    by_path: dict[str, list[ExpandProblem]] = {}
    for p in problems:
        path, _ = _locate(side, spec_side, cfg, p)
        by_path.setdefault(path, []).append(p)
    for path, group in by_path.items():
        _, message = _locate(side, spec_side, cfg, group[0])
        if len(group) > 1:
            message += f" (and {len(group) - 1} more problem(s) here)"
        col.add(path, message, group[0].hint)
    if problems:
        return None
    seen: set[int] = set()
    for r in layout.ranks:
        if id(r.tensors) in seen:
            continue
        seen.add(id(r.tensors))
        for t in r.tensors:
            for msg in tiling_problems(t, model):
                col.add(f"$.{side}", f"rank {r.rank}: {msg}")
    _check_pins(side, spec_side, layout, col)
    groups = [layout.ranks] if side == "trainer" else [layout.instance_ranks(0)]
    for ranks in groups:
        missing = uncovered(model, ranks)
        if missing:
            col.add(
                f"$.{side}.preset",
                f"{len(missing)} canonical tensor(s) held by no {side} rank: {_summarize(missing)}",
                f"add rules under {side}.rules for them (weightbridge explain shows what each rank holds)",
            )
    return layout


def _check_pins(side: str, spec_side: SideSpec, layout: SideLayout, col: _Collector) -> None:
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
