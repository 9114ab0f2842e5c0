"""Rollout templates: instances whose rank layouts are equal, slot by slot.

A pure function of the rollout layout, shared by the builder (geometry once per template slot),
the cost model (the baseline prices each distinct layout once) and the validator (identical
instances answer identically, so it checks one of them): none of them trusts another's output.
"""

from __future__ import annotations

from typing import NamedTuple

from weightbridge.layout.ir import RankLayout, SideLayout


class Template(NamedTuple):
    """Rollout instances with identical layouts.

    ``layouts[l]`` is slot ``l`` (local rank order) of the first instance; ``ranks[i][l]`` the
    rollout rank of slot ``l`` in the template's ``i``-th instance, whose instance id is
    ``instances[i]``.
    """

    layouts: tuple[RankLayout, ...]
    ranks: tuple[tuple[int, ...], ...]
    instances: tuple[int, ...]


Templates = tuple[Template, ...]


def group_instances(rollout: SideLayout) -> Templates:
    """The rollout's templates, in order of their first instance id."""
    by_inst: dict[int, list[RankLayout]] = {}
    for lay in rollout.ranks:
        by_inst.setdefault(lay.instance, []).append(lay)
    groups: list[tuple[tuple[RankLayout, ...], list[int], list[tuple[int, ...]]]] = []
    for inst in sorted(by_inst):
        lays = tuple(sorted(by_inst[inst], key=lambda x: (x.local_rank, x.rank)))
        for rep, insts, ranks in groups:
            if len(rep) == len(lays) and all(
                a.local_rank == b.local_rank and a.tensors == b.tensors for a, b in zip(rep, lays)
            ):
                insts.append(inst)
                ranks.append(tuple(x.rank for x in lays))
                break
        else:
            groups.append((lays, [inst], [tuple(x.rank for x in lays)]))
    return tuple(Template(rep, tuple(ranks), tuple(insts)) for rep, insts, ranks in groups)


def representatives(templates: Templates) -> dict[int, int]:
    """Rollout rank -> the rank of the same slot in its template's first instance."""
    rep: dict[int, int] = {}
    for tpl in templates:
        first = tpl.ranks[0]
        for ranks in tpl.ranks:
            for slot, r in enumerate(ranks):
                rep[r] = first[slot]
    return rep


def locate_rank(templates: Templates, rank: int) -> tuple[int, int, int]:
    """``(template, slot, instance index)`` of rollout rank ``rank``; ``(-1, -1, -1)`` if none holds it."""
    return next(((g, l, i) for g, t in enumerate(templates) for i, ranks in enumerate(t.ranks)
                 for l, r in enumerate(ranks) if r == rank), (-1, -1, -1))


__all__ = ["Template", "Templates", "group_instances", "locate_rank", "representatives"]
