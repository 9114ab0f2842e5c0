"""Framework presets: named rule sets in ``weightbridge/layout/presets/*.yaml``.

A preset is data in the same rule vocabulary users write (see
:mod:`weightbridge.layout.rules`), so anything a preset does a spec can override
without Python: a spec rule whose ``local`` template equals a preset rule's
replaces every preset rule with that template; other spec rules are added.

Available: ``hf`` (identity), ``megatron``, ``fsdp2``, ``vllm``, ``sglang``; each
file's ``doc`` names the local tensors it produces (``weightbridge explain``
shows them for a given rank), and ``checked_against`` the architectures it was checked
against on the real framework, each with how (``docs/architectures.md`` has the table).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from weightbridge.layout.mesh import FAMILIES, MeshFamily
from weightbridge.layout.rules import Rule

PRESET_NAMES = ("hf", "megatron", "fsdp2", "vllm", "sglang")


class PipelinePlacement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    first: list[str] = Field(default_factory=list)
    last: list[str] = Field(default_factory=list)


class PresetFile(BaseModel):
    """The YAML form of one preset file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    doc: str
    checked_against: dict[str, str] = Field(default_factory=dict)  # architecture -> how it was checked
    family: Literal["megatron", "fsdp2", "engine", "sglang", "hf"] | None = None
    extends: str | None = None
    remove: list[str] = Field(default_factory=list)
    pp_style: Literal["even", "vllm"] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    pipeline: PipelinePlacement | None = None
    rules: list[Rule] = Field(default_factory=list)


class Preset(BaseModel):
    """A resolved preset (``extends`` applied)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    doc: str
    family: MeshFamily
    pp_style: str
    checked_against: dict[str, str] = Field(default_factory=dict)
    params: dict[str, Any]
    pipeline: PipelinePlacement
    rules: tuple[Rule, ...]


def _read(name: str) -> PresetFile:
    text = resources.files("weightbridge.layout").joinpath("presets", f"{name}.yaml").read_text()
    return PresetFile.model_validate(yaml.safe_load(text))


@cache
def load_preset(name: str) -> Preset:
    """The named preset; raises KeyError for an unknown name."""
    if name not in PRESET_NAMES:
        raise KeyError(name)
    f = _read(name)
    if f.extends is None:
        if f.family is None:
            raise ValueError(f"preset {name}: needs a family")
        return Preset(
            name=name,
            doc=f.doc,
            family=FAMILIES[f.family],
            pp_style=f.pp_style or "even",
            params=dict(f.params),
            pipeline=f.pipeline or PipelinePlacement(),
            rules=tuple(f.rules),
            checked_against=dict(f.checked_against),
        )
    base = load_preset(f.extends)
    return Preset(
        name=name,
        doc=f.doc,
        family=FAMILIES[f.family] if f.family else base.family,
        pp_style=f.pp_style or base.pp_style,
        params={**base.params, **f.params},
        pipeline=f.pipeline or base.pipeline,
        rules=merge_rules(base.rules, f.rules, remove=f.remove),
        checked_against=dict(f.checked_against),  # not inherited: checked per framework
    )


def merge_rules(base: tuple[Rule, ...] | list[Rule], extra: list[Rule], remove: list[str] = ()) -> tuple[Rule, ...]:
    """``base`` minus removed/overridden local templates, then ``extra``; fallback rules stay last."""
    replaced = {r.local for r in extra} | set(remove)
    kept = [r for r in base if r.local not in replaced]
    merged = [r for r in kept if not r.is_fallback] + list(extra) + [r for r in kept if r.is_fallback]
    return tuple(merged)
