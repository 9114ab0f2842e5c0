"""Spec file -> validated spec + canonical model + per-rank layouts, reporting every problem.

Passes, each reporting all it finds (later passes skip only sections an earlier
pass rejected):

1. YAML syntax and duplicate keys;
2. the JSON Schema (``weightbridge.spec.schema``);
3. the pydantic models, per section (cross-field checks);
4. the canonical model source;
5. rule expansion per side (mesh axes, divisibility, templates, dtypes, tiling; :mod:`.sides`),
   against the canonical model without scale tensors;
6. coverage: every canonical tensor held by the trainer and by each rollout instance;
7. quantised rollout targets (:mod:`.quant`): FP8 local tensors and their scales on the rollout
   side, every block held whole by some trainer rank.

Every problem is a :class:`~weightbridge.spec.errors.SpecProblem` with file, line
and JSON path.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from weightbridge.gc_pause import gc_paused
from weightbridge.layout.ir import CanonicalModel, SideLayout
from weightbridge.plan.network import NetworkSpec
from weightbridge.spec.errors import SpecErrors, SpecProblem, excerpt, show
from weightbridge.layout.quant import unquantized
from weightbridge.spec.models import BYTES_PATTERN, NO_PRESET, ModelSource, SideSpec, Spec, SyncSpec, side_problems
from weightbridge.spec.quant import declared_model, quantized_sides
from weightbridge.spec.schema import spec_schema
from weightbridge.spec.sides import Collector, round_bytes_problem, side_pass, world_problem
from weightbridge.spec.yaml_source import MAX_TEXT_CHARS, YamlSyntaxError, child_path, load_yaml

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


def resolve_spec(path: str | Path) -> ResolvedSpec:
    """Load, validate and expand the spec at ``path``; raise :class:`SpecErrors` listing every problem."""
    resolved, problems = check_spec(path)
    if problems or resolved is None:
        raise SpecErrors(problems)
    return resolved


def load_spec(spec: str | os.PathLike[str] | ResolvedSpec) -> ResolvedSpec:
    """The resolved spec from a spec file's path, spec YAML text, or a :class:`ResolvedSpec`
    (returned as is). Public as ``weightbridge.load_spec``; what every ``from_spec`` calls.

    A ``str`` is YAML text when it spans lines, or is one line that names no file and looks
    like YAML rather than a path (``{version: 1, ...}``); otherwise it is a path. Relative model
    paths resolve against the spec file's directory (text: the working directory). Raises
    :class:`SpecErrors` listing every problem (an unreadable file is one of them).
    """
    if isinstance(spec, ResolvedSpec):
        return spec
    if isinstance(spec, str) and _is_spec_text(spec):
        resolved, problems = check_text(spec, "<spec>")
        if problems or resolved is None:
            raise SpecErrors(problems)
        return resolved
    return resolve_spec(os.fspath(spec))


def _is_spec_text(text: str) -> bool:
    if "\n" in text:
        return True
    try:
        if Path(text).is_file():
            return False
    except (OSError, ValueError):  # too long for a file name, a NUL byte: not a path
        return True
    looks_like_path = text.lower().endswith((".yaml", ".yml", ".json")) or ":" not in text
    return not looks_like_path


def check_spec(path: str | Path) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Like :func:`resolve_spec` but returns ``(resolved or None, problems)``."""
    path = Path(path)
    shown = excerpt(str(path))
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_TEXT_CHARS + 1)  # never more: /dev/zero is not a spec
    except ValueError:  # an embedded NUL byte
        return None, [SpecProblem("$", "cannot read spec: the path contains a NUL byte", file=shown)]
    except OSError as exc:
        return None, [SpecProblem("$", f"cannot read spec: {exc.strerror or exc}", file=shown)]
    if len(raw) > MAX_TEXT_CHARS:
        too_big = f"spec file is larger than {MAX_TEXT_CHARS:,} bytes"
        return None, [SpecProblem("$", too_big, "a spec is a few KiB of YAML", shown)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, [SpecProblem("$", f"spec is not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded",
                                  "a spec is YAML text: save it as UTF-8", shown, line)]
    return check_text(text, str(path), base_dir=path.parent)


def check_text(text: str, file: str = "<spec>", base_dir: Path | None = None) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Validate spec text; relative model paths resolve against ``base_dir`` (default: cwd)."""
    try:
        src = load_yaml(text, file)
    except YamlSyntaxError as exc:
        return None, [SpecProblem("$", str(exc), exc.hint, file, exc.line)]
    col = Collector(src)
    for dup_path, line in src.duplicates:
        col.add(dup_path, "duplicate key", "YAML keeps only the last one; remove the other", line)
    if not isinstance(src.data, dict):
        col.add("$", "a spec must be a mapping", "start from an example spec: `weightbridge examples`")
        return None, col.problems
    _schema_pass(src.data, col)
    sections = _model_pass(src.data, col)
    layouts: dict[str, SideLayout] = {}
    with gc_paused():  # canonical models and expansion allocate ~10^6 small tuples (weightbridge/gc_pause.py)
        canonical = _canonical_pass(sections.get("model"), base_dir or Path.cwd(), col)
        if canonical is not None and col.section_ok("$.rollout"):
            canonical = declared_model(canonical, sections.get("rollout"), col.add)  # type: ignore[arg-type]
        if canonical is not None:
            for side in SIDES:
                spec_side = sections.get(side)
                if isinstance(spec_side, SideSpec) and col.section_ok(f"$.{side}"):
                    too_big = world_problem(side, spec_side)
                    if too_big is not None:
                        col.add(*too_big)
                        continue
                    lay = side_pass(side, spec_side, unquantized(canonical), col)
                    if lay is not None:
                        layouts[side] = lay
            if canonical.quant and len(layouts) == 2:
                quantized = quantized_sides(canonical, layouts["trainer"], layouts["rollout"], col.add)
                if quantized is not None:
                    layouts["rollout"] = quantized
    sync = sections.get("sync")
    if "rollout" in layouts and isinstance(sync, SyncSpec):
        too_fine = round_bytes_problem(layouts["rollout"], sync.round_bytes)
        if too_fine is not None:
            col.add("$.sync.round_bytes", *too_fine)
    rollout = sections.get("rollout")
    if isinstance(sync, SyncSpec) and isinstance(rollout, SideSpec) and (sync.min_instances or 0) > rollout.instances:
        col.add("$.sync.min_instances", f"min_instances {sync.min_instances} exceeds rollout.instances "
                f"({rollout.instances})", "at most the spec's rollout instances (omit it: all of them)")
    network = sections.get("network")
    if isinstance(network, NetworkSpec) and "trainer" in layouts and "rollout" in layouts:
        for message in network.host_problems(layouts["trainer"].world_size, layouts["rollout"].world_size):
            col.add("$.network.hosts", message, "place every rank of both sides (count: N repeats a host)")
    if col.problems:
        return None, sorted(col.problems, key=lambda p: (p.line or 0, p.path))
    spec = Spec.model_validate(src.data)
    spec_hash = hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
    return ResolvedSpec(file, spec, canonical, layouts["trainer"], layouts["rollout"], spec_hash), []  # type: ignore[arg-type]


# ---- pass 2: JSON Schema --------------------------------------------------------------------


def _schema_pass(data: dict[str, Any], col: Collector) -> None:
    validator = jsonschema.Draft202012Validator(spec_schema())
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        path = "$"
        for key in err.absolute_path:
            path = child_path(path, key)
        _report_schema_error(err, path, col)


def _report_schema_error(err: jsonschema.ValidationError, path: str, col: Collector) -> None:
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed] if isinstance(err.instance, dict) else []
        for key in extra:
            close = difflib.get_close_matches(str(key)[:100], allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            col.add(child_path(path, key), f"unknown key {show(key)}", hint)
        return
    if v == "required":
        col.add(path, err.message.replace("is a required property", "is required"), "add it; see the example specs: `weightbridge examples`")
        return
    if v == "enum":
        options = [str(o) for o in err.validator_value]
        close = difflib.get_close_matches(str(err.instance)[:100], options, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "one of: " + ", ".join(options)
        col.add(path, f"{show(err.instance)} is not allowed here", hint)
        return
    if v == "const":
        col.add(path, f"{show(err.instance)} must be {err.validator_value!r}", "")
        return
    if v == "type":
        want = err.validator_value
        col.add(path, f"expected {want if isinstance(want, str) else ' or '.join(want)}, got {type(err.instance).__name__} {show(err.instance)}")
        return
    if v in ("anyOf", "oneOf"):
        forms = err.schema.get("anyOf", []) + err.schema.get("oneOf", [])
        if any(f.get("pattern") == BYTES_PATTERN for f in forms):
            low = min((f["minimum"] for f in forms if "minimum" in f), default=None)
            number = isinstance(err.instance, (int, float)) and not isinstance(err.instance, bool)
            if low is not None and number and err.instance < low:
                col.add(path, f"{show(err.instance)} is below the minimum of {low} bytes",
                        f"use at least {low}, e.g. '64MiB'")
                return
            col.add(path, f"{show(err.instance)} is not a byte size", "an integer or a size such as '256MiB'")
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
            col.add(path, f"expected {' or '.join(types)}, got {type(err.instance).__name__} {show(err.instance)}")
            return
        col.add(path, f"{show(err.instance)} does not match any allowed form")
        return
    if v in ("maximum", "exclusiveMaximum") and isinstance(err.instance, (int, float)):
        limit = err.validator_value
        col.add(path, f"{show(err.instance)} is above the maximum of {limit:g}",
                f"use a finite number {'below' if v == 'exclusiveMaximum' else 'of at most'} {limit:g}")
        return
    col.add(path, excerpt(err.message, 400))


# ---- pass 3: pydantic per section ------------------------------------------------------------


def _model_pass(data: dict[str, Any], col: Collector) -> dict[str, BaseModel]:
    out: dict[str, BaseModel] = {}
    models: dict[str, type[BaseModel]] = {"model": ModelSource, "trainer": SideSpec, "rollout": SideSpec, "sync": SyncSpec}
    if isinstance(data.get("network"), dict):
        models["network"] = NetworkSpec
    for key, cls in models.items():
        path = f"$.{key}"
        if key not in data or not col.section_ok(path):
            continue
        try:
            out[key] = cls.model_validate(data[key], context={"located": True})  # cross-field checks below
        except ValidationError as exc:
            for e in exc.errors():
                sub = path
                for part in e["loc"]:
                    sub = child_path(sub, part)
                col.add(sub, e["msg"].removeprefix("Value error, "))
    for side in SIDES:
        if isinstance(data.get(side), dict):  # also when the side has schema errors: report everything at once
            for field, message, hint in side_problems(data[side]):
                col.add(f"$.{side}.{field}", message, hint)
    rollout = out.get("rollout")
    if isinstance(rollout, SideSpec) and rollout.preset not in ("vllm", "sglang", "hf", NO_PRESET):
        col.add("$.rollout.preset", f"{rollout.preset!r} is a trainer preset", "rollout presets: vllm, sglang, hf (or none: your own rules)")
    trainer = out.get("trainer")
    if isinstance(trainer, SideSpec) and trainer.quantization is not None:
        col.add("$.trainer.quantization", "quantization says what the rollout serves", "move it under rollout:")
    if isinstance(trainer, SideSpec) and trainer.instances != 1:
        col.add("$.trainer.instances", "the trainer is one instance", "use mesh dp for data-parallel replicas")
    return out


# ---- pass 4: canonical model -----------------------------------------------------------------


def _canonical_pass(source: BaseModel | None, base_dir: Path, col: Collector) -> CanonicalModel | None:
    if not isinstance(source, ModelSource):
        return None
    from weightbridge.canonical import CanonicalSourceError, load_canonical

    try:
        return load_canonical(source.model_dump(exclude_none=True), base_dir)
    except CanonicalSourceError as exc:
        path = "$.model" if exc.key == "model" else f"$.model.{exc.key}"
        col.add(path, exc.message, exc.hint)
        return None
