"""Spec rules where a preset has none, written from probe files (``weightbridge rules``).

:func:`rules_from_probes` takes a spec, a side and the probe JSON of each rank of one instance
(what ``weightbridge probe`` writes, or what the vLLM integration names when an engine refuses a
spec: ``probe JSON: ...``). It diffs the spec's expansion of every rank against its probe, infers
a rule for each local tensor that differs or that only the probe has
(:func:`weightbridge.layout.infer.infer_rules`), switches off the side's rules for tensors only
the spec has (``when: false``), and checks the result the only way that counts: the spec with
those rules added (replacing the spec's own rules for the same local templates) is expanded again
and diffed against every probe. Nothing is applied to the spec file; the caller gets YAML to paste
under the side's ``rules:`` (in place of the spec's rules for those tensors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from weightbridge.layout.infer import infer_rules
from weightbridge.layout.ir import RankLayout


@dataclass
class ProbeRules:
    """What :func:`rules_from_probes` found: rules to add, what they cannot say, what still differs."""

    rules: list[dict[str, Any]] = field(default_factory=list)
    unexplained: list[tuple[str, str]] = field(default_factory=list)  # (local tensor, why)
    remaining: list[str] = field(default_factory=list)  # differences left after adding the rules, per rank

    @property
    def ok(self) -> bool:
        return not self.remaining

    def yaml(self) -> str:
        if not self.rules:
            return "rules: []\n"
        return yaml.safe_dump({"rules": self.rules}, sort_keys=False, default_flow_style=None, width=120)


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[a-z_*]+\\\}", r"[^.]+", re.escape(template)) + r"\Z")


def rules_from_probes(spec: str | Path, side: str, probes: list[RankLayout], *, instance: int = 0) -> ProbeRules:
    """Rules making ``side`` of ``spec`` expand to ``probes`` (the ranks of ``instance``, any order).

    Raises :class:`~weightbridge.spec.errors.SpecErrors` for an invalid spec and ``ValueError`` when
    the probes are not one per rank of the instance."""
    from weightbridge.probe.diff import diff_layouts, format_diff
    from weightbridge.spec.resolve import check_text, load_spec

    path = Path(spec)
    resolved = load_spec(path)
    layout = resolved.side(side)
    ranks = [r for r in layout.ranks if r.instance == instance] if side == "rollout" else list(layout.ranks)
    probes = sorted(probes, key=lambda p: p.local_rank if side == "rollout" else p.rank)
    if len(probes) != len(ranks):
        raise ValueError(f"{len(probes)} probe(s) for the {len(ranks)} {side} rank(s) of the spec: give one per rank")
    coords = [dict(r.coords) for r in ranks]
    moving = sorted({a for c in coords for a in c if c[a] != coords[0][a]})
    axis = "tp" if "tp" in moving or not moving else moving[0]  # derived axes (an engine's etp) move with tp
    if len(moving) > 1 and any(any(c[a] != c[axis] for c in coords) for a in moving):
        raise ValueError(f"the {side} ranks differ along {moving}: rules are inferred along one mesh axis")
    held = {t.name for p in probes for t in p.tensors if t.pieces}  # by any rank's probe
    differ: set[str] = set()
    only_spec: set[str] = set()
    for want, got in zip(ranks, probes):
        for d in diff_layouts(want, got):
            (differ if d.name in held else only_spec).add(d.name)
    inferred = infer_rules(resolved.canonical, probes, axis=axis, names=sorted(differ))
    out = ProbeRules(rules=list(inferred.rules), unexplained=list(inferred.unexplained))
    made = {r["local"] for r in out.rules}
    side_spec = getattr(resolved.spec, side)
    from weightbridge.spec.sides import side_config

    for rule, _ in side_config(side, side_spec).rules:
        if rule.is_fallback or rule.local in made or not any(_template_regex(rule.local).match(n) for n in only_spec):
            continue  # ({*} takes what no other rule does: the new rules' canonical tensors leave it)
        made.add(rule.local)
        out.rules.append({"local": rule.local, "canonical": rule.parts()[0].canonical, "when": False})
    # Check: the spec with these rules, expanded again, against every probe.
    data = yaml.safe_load(path.read_text())
    made = {r["local"] for r in out.rules}  # the spec's own rules for these tensors are replaced
    data[side]["rules"] = [r for r in data[side].get("rules") or [] if r.get("local") not in made] + out.rules
    again, problems = check_text(yaml.safe_dump(data, sort_keys=False), str(path), path.parent)
    if problems or again is None:
        out.remaining = [f"the spec with these rules does not validate: {p}" for p in problems]
        return out
    new_ranks = [r for r in again.side(side).ranks if r.instance == instance] if side == "rollout" else list(
        again.side(side).ranks)
    for want, got in zip(new_ranks, probes):
        diffs = diff_layouts(want, got)
        if diffs:
            out.remaining.append(f"{side} rank {want.rank}:\n{format_diff(diffs, limit=5)}")
    return out
