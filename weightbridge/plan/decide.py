"""Step 3 of the planner (under ``receiver_dedup="auto"``): is receiver de-replication worth it?

Prices the update with and without it on the cost model (:mod:`weightbridge.plan.cost`), from
chunk bytes with replicated atoms split evenly, plus one latency per forwarded message, and
says yes only when it is at least 10% faster.

Input: :class:`Cover`, :data:`Templates`, :class:`NetworkModel`. Output: :class:`DedupDecision`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import dtype_bytes
from weightbridge.plan.cost import Links, flows_seconds
from weightbridge.plan.cover import Cover
from weightbridge.plan.instances import Templates
from weightbridge.plan.network import NetworkModel
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
    slot_tot: dict[tuple[int, int], float] = {}
    if not (net.colocated or net.shared_nodes):  # trainer -> rollout is NIC to NIC: sum per rank
        out_p: dict[int, float] = {}
        out_d: dict[int, float] = {}
        in_slot: dict[tuple[int, int], float] = {}
        for (s, g, l), b in agg.items():
            ninst = len(templates[g].ranks)
            out_p[s] = out_p.get(s, 0) + b * ninst
            out_d[s] = out_d.get(s, 0) + b
            in_slot[(g, l)] = in_slot.get((g, l), 0) + b
        for (g, l), b in in_slot.items():
            if len(templates[g].ranks) > 1:
                slot_tot[(g, l)] = b
        in_d = [b / len(templates[g].ranks) for (g, l), b in in_slot.items()]
        t_plain = max([0, *out_p.values(), *in_slot.values()]) / net.nic_bytes_per_s
        t_update = max([0, *out_d.values(), *in_d]) / net.nic_bytes_per_s
    else:
        plain = []
        dedup = []
        for (s, g, l), b in agg.items():
            ranks = templates[g].ranks
            ninst = len(ranks)
            for x in range(ninst):
                plain.append((TRAINER, s, ROLLOUT, ranks[x][l], b))
                dedup.append((TRAINER, s, ROLLOUT, ranks[x][l], b / ninst if ninst > 1 else b))
            if ninst > 1:
                slot_tot[(g, l)] = slot_tot.get((g, l), 0) + b
        t_plain = flows_seconds(plain, net)
        t_update = flows_seconds(dedup, net)
    forwards = Links(net)  # every instance's slot forwards its share to the slot of every other instance
    for (g, l), per_inst in slot_tot.items():
        ranks = templates[g].ranks
        forwards.add_all_to_all(ROLLOUT, [r[l] for r in ranks], per_inst / len(ranks))
    # forwarding adds at least one round and (instances - 1) messages per rank
    most = max((len(t.ranks) for t in templates), default=1)
    t_dedup = t_update + forwards.wire_seconds() + net.message_latency_s * most
    use = t_dedup < 0.9 * t_plain
    note = (
        f"receiver de-replication {'on' if use else 'off'}: estimated {t_dedup:.3g}s with vs {t_plain:.3g}s without"
    )
    return DedupDecision(use, note)


__all__ = ["DedupDecision", "decide_receiver_dedup"]
