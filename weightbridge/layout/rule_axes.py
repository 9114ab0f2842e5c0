"""Which mesh axes a rule depends on, and whether its problems can depend on a rank's coordinates. Pure.

Used by :mod:`weightbridge.layout.expand` to check axis names, to key the ranks whose tensors are
the same, and to decide which rules a refused side's other ranks are searched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from weightbridge.layout.rules import Rule


def rule_axes(rule: Rule) -> list[tuple[str, str]]:
    """Every mesh axis ``rule`` names, with the field naming it (``concat.parts[1].shard[0].axis``).
    ``expert_axis`` counts only where the rule binds ``{expert}`` without stacking."""
    out: list[tuple[str, str]] = []
    body = "concat" if rule.concat is not None else "interleave" if rule.interleave is not None else ""
    for k, part in enumerate(rule.parts()):
        prefix = f"{body}.parts[{k}]." if body else ""
        out += [(op.axis, f"{prefix}shard[{j}].axis") for j, op in enumerate(part.shard)]
    if rule.interleave is not None and rule.interleave.axis:
        out.append((rule.interleave.axis, "interleave.axis"))
    if rule.stack is not None:
        if rule.stack.axis:
            out.append((rule.stack.axis, "stack.axis"))
    elif any("{expert}" in p.canonical for p in rule.parts()):
        out.append((rule.expert_axis, "expert_axis"))
    return out


def axes_used(rules: Sequence[tuple[Rule, Any]]) -> set[str]:
    """Every mesh axis the rules (each paired with its origin) shard over or own experts by."""
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


def coordinate_sensitive(rule: Rule) -> bool:
    """Whether the rule's problems can differ between ranks that hold the same bindings. Shard steps
    that divide evenly give every coordinate the same extents, so a problem at one rank is a problem
    at all. An ``uneven`` step gives ranks different extents of its dim: a later step on that dim
    sees them, and so do the shape checks between parts (concat) and experts (stack); a last uneven
    step of a single tensor (FSDP2's dp shard) checks nothing that depends on them."""
    uneven = False
    for part in rule.parts():
        for j, op in enumerate(part.shard):
            if op.uneven:
                uneven = True
                if any(later.dim == op.dim for later in part.shard[j + 1:]):
                    return True
    return uneven and (rule.concat is not None or rule.stack is not None)
