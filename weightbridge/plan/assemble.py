"""Step 6 of the planner: packets and their rounds -> the rounds of buckets.

One :class:`Bucket` per ``(round, sender, receiver)``: the items of template packets first,
then per-instance items, each in packet (canonical) order. A template packet's item tuple is
shared by the buckets of all its instances (one object, not one copy per instance).

Input: :class:`Packets`, :class:`Schedule`, :data:`Templates`. Output: ``tuple[Round, ...]``.
"""

from __future__ import annotations

from weightbridge.plan.dereplicate import Packets
from weightbridge.plan.instances import Templates, locate_rank
from weightbridge.plan.rounds import Schedule
from weightbridge.plan.types import ROLLOUT, TRAINER, Bucket, Round, WireItem


def assemble(packets: Packets, schedule: Schedule, templates: Templates,
             only: tuple[str, int] | None = None) -> tuple[Round, ...]:
    """Buckets per (round, sender, receiver); items in packet order, template items first.

    ``only=(side, rank)`` keeps the buckets that rank sends or receives (a rank's slice of the
    plan, :func:`weightbridge.plan.build.build_rank_plan`); the rounds keep their indices and
    rounds without such buckets are left out."""
    tl: dict[tuple, list] = {}  # key -> [items..., ] with running bytes in nb
    tb: dict[tuple, int] = {}
    pl: dict[tuple, list[WireItem]] = {}
    pb: dict[tuple, int] = {}
    xl: dict[tuple, list[WireItem]] = {}
    xb: dict[tuple, int] = {}
    xt: dict[tuple, tuple[int, ...]] = {}  # a forwarding instance's targets (fixed per template, slot, instance)
    sender = here = None  # the trainer rank kept; the (template, slot, instance) of the rollout rank kept
    if only is not None:
        side, rank = only
        if side == TRAINER:
            sender = rank
        else:
            here = locate_rank(templates, rank)
    for (s, w, g, l, i, b, items), rho in zip(packets.updates, schedule.update_rounds):
        if only is not None and (s != sender if here is None else
                                 (g, l) != here[:2] or (i >= 0 and i != here[2])):
            continue
        if i < 0:
            key = (rho, s, g, l)
            lst, acc = tl, tb
        else:
            key = (rho, s, templates[g].ranks[i][l])
            lst, acc = pl, pb
        _add(lst, acc, key, items, b)
    if sender is None:  # a trainer rank takes no part in forwards
        for (s, w, g, l, i, b, items, _, targets), rho in zip(packets.forwards, schedule.forward_rounds):
            if here is not None and ((g, l) != here[:2] or here[2] not in (i, *targets)):
                continue
            key = (rho, s, g, l, i)
            _add(xl, xb, key, items, b)
            xt[key] = targets
    per_round: dict[int, list[Bucket]] = {}
    new = tuple.__new__
    for key, lst in tl.items():
        rho, s, g, l = key
        tt = tuple(lst)
        nb = tb[key]
        bl = per_round.get(rho)
        if bl is None:
            bl = per_round[rho] = []
        every = templates[g].ranks if here is None else (templates[g].ranks[here[2]],)
        if not pl:
            bl.extend([new(Bucket, (TRAINER, s, ranks[l], tt, nb)) for ranks in every])
            continue
        for ranks in every:
            r = ranks[l]
            pkey = (rho, s, r)
            more = pl.pop(pkey, None)
            if more is None:
                bl.append(new(Bucket, (TRAINER, s, r, tt, nb)))
            else:
                bl.append(new(Bucket, (TRAINER, s, r, tt + tuple(more), nb + pb[pkey])))
    for key, lst in pl.items():
        rho, s, r = key
        per_round.setdefault(rho, []).append(Bucket(TRAINER, s, r, tuple(lst), pb[key]))
    for key, lst in xl.items():
        rho, s, g, l, i = key
        tt = tuple(lst)
        nb = xb[key]
        bl = per_round.setdefault(rho, [])
        for m_ in xt[key]:
            if here is None or here[2] in (i, m_):
                bl.append(Bucket(ROLLOUT, s, templates[g].ranks[m_][l], tt, nb))
    out = []
    for rho in sorted(per_round):
        bl = per_round[rho]
        bl.sort()  # (src_side, sender, receiver) is unique within a round; update and exchange never share one
        out.append(Round(rho, tuple(bl)))
    return tuple(out)


__all__ = ["assemble"]


def _add(lists: dict, sizes: dict, key: tuple, items: tuple, nbytes: int) -> None:
    """Append ``items`` (``nbytes`` on the wire) to the bucket ``key`` of ``lists`` / ``sizes``."""
    cur = lists.get(key)
    if cur is None:
        lists[key] = list(items)
        sizes[key] = nbytes
    else:
        cur.extend(items)
        sizes[key] += nbytes
