"""Receiver de-replication's relay groups: per template slot, the template's instances grouped by node.

A unit of a de-replicated template crosses into each group once, to the group's instance that has
received least of that slot so far, and that instance forwards it to the rest of its group
(:mod:`.dereplicate`). So each byte enters each node at most once per slot, and forwarding stays
on the node's intra-node links. One group of every instance (one host, or ``ranks_per_node``
covering the rollout) is the all-to-all exchange between instances; groups of one instance each
(one instance per node) need no forwarding at all.

Input: :data:`Templates` and the :class:`NetworkModel` (its ``node_of``). Output: :data:`Relays`.
"""

from __future__ import annotations

from weightbridge.plan.instances import Templates
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.types import ROLLOUT

Group = tuple[int, ...]  # instance indices of a template, ascending
Relays = tuple[tuple[tuple[Group, ...], ...], ...]  # [template][slot] -> its groups, in order of first instance


def relay_groups(templates: Templates, net: NetworkModel) -> Relays:
    """Per template and slot, the instances whose rank of that slot is on one node, node by node."""
    out = []
    for t in templates:
        per_slot = []
        for slot in range(len(t.layouts)):
            by_node: dict = {}
            for i, ranks in enumerate(t.ranks):
                by_node.setdefault(net.node_of(ROLLOUT, ranks[slot]), []).append(i)
            per_slot.append(tuple(tuple(g) for g in by_node.values()))
        out.append(tuple(per_slot))
    return tuple(out)


def group_of(relays: Relays, template: int, slot: int, instance: int) -> Group:
    """The group of ``instance`` at ``(template, slot)``."""
    return next(g for g in relays[template][slot] if instance in g)


def one_group(templates: Templates) -> Relays:
    """Every instance in one group (no placement: the all-to-all exchange)."""
    return tuple(tuple((tuple(range(len(t.ranks))),) for _ in t.layouts) for t in templates)


__all__ = ["Group", "Relays", "group_of", "one_group", "relay_groups"]
