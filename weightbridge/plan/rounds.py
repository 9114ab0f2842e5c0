"""Step 5 of the planner: packets -> the round of each packet (round packing).

**Packing.** ``N = ceil(max rank bytes / (0.95 * round_bytes))`` rounds are planned. Packets
are visited in canonical order; a packet carrying bytes ``[c, c + b)`` of what its receiver slot
(``(template, slot)``: the same rank of every instance) gets in total, ``T_r``, wants round
``floor((c + b/2) / T_r * N)``: every receiver takes in its tensors in canonical order, evenly
over the rounds, whichever senders hold them, so the parts of one local tensor that different
senders hold arrive in the same round or the next. That bounds what a streaming receiver holds
(``docs/memory.md``, :mod:`weightbridge.plan.streaming`): pacing by the senders instead (each
sender spreading its own bytes) had every pipeline stage of a trainer feed a receiver a different
layer at once. A packet goes to the first round from the wanted one on (then backwards, then a
new round) where no rank of it exceeds ``round_bytes`` (sent + received). Receivers of a template are
tracked as ``common[slot][round] + extra[instance, slot][round]``, so checking a packet that
goes to all instances costs O(1).

Exchange packets (receiver de-replication) share the rounds: each goes no earlier than one
round after the update packets it forwards from arrive (updates aim at the first ``N - 1``
rounds so the last round is left for forwards), and counts against the cap of its sender and
of every receiver (the rest of its relay group), so NIC-bound updates and NVLink-bound forwards overlap.

Input: :class:`Packets`, :data:`Templates`, ``round_bytes``. Output: :class:`Schedule`.
"""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

from weightbridge.plan.dereplicate import Packets
from weightbridge.plan.instances import Templates

FILL = 0.95


class Schedule(NamedTuple):
    """Round indices (0, 1, ... with no gaps) of ``Packets.updates`` and ``Packets.forwards``, index by index."""

    update_rounds: tuple[int, ...]
    forward_rounds: tuple[int, ...]


def _num_rounds(maxload: int, cap: int) -> int:
    return max(1, -(-maxload // max(1, int(cap * FILL))))


def pack(packets: Packets, templates: Templates, round_bytes: int) -> Schedule:
    """The round of every update and every forward packet."""
    cap = round_bytes
    updates, forwards = packets.updates, packets.forwards
    send_tot: dict[int, int] = {}
    common_tot: dict[tuple[int, int], int] = {}
    extra_tot: dict[tuple[int, int, int], int] = {}
    for s, w, g, l, i, b, _ in updates:
        send_tot[s] = send_tot.get(s, 0) + w
        if i < 0:
            common_tot[(g, l)] = common_tot.get((g, l), 0) + b
        else:
            extra_tot[(g, i, l)] = extra_tot.get((g, i, l), 0) + b
    xs_tot: dict[tuple[int, int, int], int] = {}
    for s, w, g, l, i, b, _, _, targets in forwards:
        xs_tot[(g, i, l)] = xs_tot.get((g, i, l), 0) + w
        extra_tot[(g, i, l)] = extra_tot.get((g, i, l), 0) + w
        for m_ in targets:
            extra_tot[(g, m_, l)] = extra_tot.get((g, m_, l), 0) + b
    recv = dict.fromkeys(((g, i, l) for g, t in enumerate(templates) for i in range(len(t.ranks))
                          for l in range(len(t.layouts))), 0)
    for key, b in extra_tot.items():
        recv[key] += b
    for (g, l), b in common_tot.items():
        for i in range(len(templates[g].ranks)):
            recv[(g, i, l)] += b
    maxload = max([1, *send_tot.values(), *recv.values()])
    n = _num_rounds(maxload, cap)
    # with exchanges, updates aim at rounds [0, n-1) so that every forward has a later round
    nu = n - 1 if (forwards and n > 1) else n
    nr = n
    sl: dict[int, list[int]] = {}
    common: dict[tuple[int, int], list[int]] = {}
    mx: dict[tuple[int, int], list[int]] = {}
    extra: dict[tuple[int, int, int], list[int]] = {}
    cum: dict = {}
    out = [0] * (len(updates) + len(forwards))
    slot_tot: dict[tuple[int, int], int] = {}  # receiver slot -> its bytes (the pace of its packets)
    for _, _, g, l, _, b, _ in updates:
        slot_tot[(g, l)] = slot_tot.get((g, l), 0) + b

    def grow(lst: list[int], upto: int) -> None:
        if upto >= len(lst):
            lst.extend([0] * (upto + 1 - len(lst)))

    for idx, (s, w, g, l, i, b, _) in enumerate(updates):
        every = i < 0
        key = (g, l)
        c = cum.get(key, 0)
        cum[key] = c + b
        d = int((c + b / 2) * nu / slot_tot[key])
        if d >= nu:
            d = nu - 1
        ls = sl.get(s)
        if ls is None:
            ls = sl[s] = [0] * n
        cm = common.get(key)
        if cm is None:
            cm = common[key] = [0] * n
            mx[key] = [0] * n
        m = mx[key]
        if not every:
            ekey = (g, i, l)
            ex = extra.get(ekey)
            if ex is None:
                ex = extra[ekey] = [0] * n
        rho = -1
        # fast path: the wanted round has room (lists are at least n long, d < n)
        if ls[d] + w <= cap and cm[d] + (m[d] if every else ex[d]) + b <= cap:
            rho = d
        else:
            for r in chain(range(d + 1, nr), range(d - 1, -1, -1)):
                if r >= len(ls):
                    grow(ls, r)
                if r >= len(cm):
                    grow(cm, r)
                    grow(m, r)
                if ls[r] + w > cap:
                    continue
                if every:
                    if cm[r] + m[r] + b > cap:
                        continue
                else:
                    if r >= len(ex):
                        grow(ex, r)
                    if cm[r] + ex[r] + b > cap:
                        continue
                rho = r
                break
        if rho < 0:
            rho = nr
            nr += 1
            grow(ls, rho)
            grow(cm, rho)
            grow(m, rho)
            if not every:
                grow(ex, rho)
        ls[rho] += w
        if every:
            cm[rho] += b
        else:
            ex[rho] += b
            if ex[rho] > m[rho]:
                m[rho] = ex[rho]
        out[idx] = rho
    # exchanges: after the rounds their data arrives in; a rollout rank's sent + received count
    base = len(updates)
    cum = {}
    slot_lists: dict[tuple[int, int], list[list[int]]] = {}
    for idx, (s, w, g, l, i, b, _, after, targets) in enumerate(forwards):
        skey = (g, i, l)
        c = cum.get(skey, 0)
        cum[skey] = c + w
        first = 1 + max((out[p] for p in after), default=-1)
        d = max(first, min(n - 1, int((c + w / 2) * n / xs_tot[skey])))
        cm = common.setdefault((g, l), [0] * n)
        lists = slot_lists.get((g, l))
        if lists is None:
            lists = slot_lists[(g, l)] = [extra.setdefault((g, m_, l), [0] * n)
                                          for m_ in range(len(templates[g].ranks))]
            top = max(len(cm), *(len(lst) for lst in lists)) - 1
            grow(cm, top)
            for lst in lists:
                grow(lst, top)
        mine = lists[i]
        tl = [lists[m_] for m_ in targets]
        rho = -1
        for r in chain(range(d, nr), range(d - 1, first - 1, -1)):
            if r >= len(cm):
                grow(cm, r)
                for lst in lists:
                    grow(lst, r)
            base_r = cm[r]
            if base_r + mine[r] + w > cap:
                continue
            lim = cap - base_r - b
            ok = True
            for lst in tl:
                if lst[r] > lim:
                    ok = False
                    break
            if ok:
                rho = r
                break
        if rho < 0:
            rho = max(nr, first)
            nr = rho + 1
            grow(cm, rho)
            for lst in lists:
                grow(lst, rho)
        for lst in tl:
            lst[rho] += b
        mine[rho] += w
        out[base + idx] = rho
    used = sorted(set(out))
    if used and used[-1] != len(used) - 1:
        remap = {r: k for k, r in enumerate(used)}
        out = [remap[r] for r in out]
    return Schedule(tuple(out[:base]), tuple(out[base:]))


__all__ = ["FILL", "Schedule", "pack"]
