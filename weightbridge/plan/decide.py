"""Step 3 of the planner (under ``receiver_dedup="auto"``): is receiver de-replication worth it?

Prices the update with and without it on the cost model (:mod:`weightbridge.plan.cost`), from
chunk bytes with replicated atoms split evenly, each unit entering each relay group once
(:mod:`.relays`) and forwarded inside it, plus one latency per forwarded message, and says yes
only when it is at least 10% faster.

Input: :class:`Cover`, :data:`Templates`, :class:`NetworkModel`. Output: :class:`DedupDecision`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import dtype_bytes
from weightbridge.plan.cost import Links
from weightbridge.plan.cover import Cover
from weightbridge.plan.instances import Templates
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.relays import relay_groups
from weightbridge.plan.types import ROLLOUT, TRAINER


class DedupDecision(NamedTuple):
    use: bool
    note: str  # printed in TransferPlan.notes


def decide_receiver_dedup(cover: Cover, templates: Templates, net: NetworkModel,
                          holders: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None) -> DedupDecision:
    """Price the update with and without receiver de-replication; use it only if >= 10% faster.

    Estimated from chunk bytes, with replicated atoms split evenly among their holders.
    ``holders`` maps the cover's holder ranks to the update's (``cover`` is a replica group's
    sub-problem and ``templates`` the whole rollout's: the whole update is priced).
    """
    per_atom: dict[tuple[tuple[int, ...], int, int], float] = {}  # (holder ranks, g, l) -> bytes per instance
    for atom, chunk_list in cover.chunks:
        hk = tuple(h[0] for h in atom.holders)
        for g, l, cbox, dt, dp in chunk_list:
            key = (hk, g, l)
            per_atom[key] = per_atom.get(key, 0) + box_numel(cbox) * dtype_bytes(dt.dtype)
    agg: dict[tuple[int, int, int], float] = {}  # (s, g, l) -> bytes per instance
    for (hk, g, l), b in per_atom.items():
        if holders is not None:
            hk = holders(hk)
        share = b / len(hk)
        for s in hk:
            key = (s, g, l)
            agg[key] = agg.get(key, 0) + share
    relays = relay_groups(templates, net)
    plain, update, forwards = Links(net), Links(net), Links(net)  # forwards: inside each relay group
    slot_tot: dict[tuple[int, int], float] = {}
    for (s, g, l), b in agg.items():
        ranks = templates[g].ranks
        for x in ranks:
            plain.add(TRAINER, s, ROLLOUT, x[l], b)
        if len(ranks) == 1:
            update.add(TRAINER, s, ROLLOUT, ranks[0][l], b)
            continue
        slot_tot[(g, l)] = slot_tot.get((g, l), 0) + b
        for grp in relays[g][l]:  # each group's instances take turns receiving a unit
            for x in grp:
                update.add(TRAINER, s, ROLLOUT, ranks[x][l], b / len(grp))
    most = 1
    for (g, l), per_inst in slot_tot.items():
        ranks = templates[g].ranks
        for grp in relays[g][l]:
            most = max(most, len(grp))
            forwards.add_all_to_all(ROLLOUT, [ranks[x][l] for x in grp], per_inst / len(grp))
    # forwarding adds at least one round and (group size - 1) messages per rank
    t_plain = plain.wire_seconds()
    t_dedup = update.wire_seconds() + forwards.wire_seconds() + net.message_latency_s * most
    use = t_dedup < 0.9 * t_plain
    note = (
        f"receiver de-replication {'on' if use else 'off'}: estimated {t_dedup:.3g}s with vs {t_plain:.3g}s without"
    )
    return DedupDecision(use, note)


__all__ = ["DedupDecision", "decide_receiver_dedup"]
