"""Round packing, bucket assembly and the receiver de-replication decision.

**Packing.** ``N = ceil(max rank bytes / (0.95 * round_bytes))`` rounds are planned. Packets
are visited in canonical order; a packet carrying sender ``s``'s bytes ``[c, c + w)`` of its
total ``T_s`` wants round ``floor((c + w/2) / T_s * N)``: every sender spreads its bytes
evenly over the rounds, and so every receiver, which hears from many senders, does too.
A packet goes to the first round from the wanted one on (then backwards, then a new round)
where no rank of it exceeds ``round_bytes`` (sent + received). Receivers of a template are
tracked as ``common[slot][round] + extra[instance, slot][round]``, so checking a packet that
goes to all instances costs O(1).

Exchange packets (receiver de-replication) share the rounds: each goes no earlier than one
round after the update packets it forwards from arrive (updates aim at the first ``N - 1``
rounds so the last round is left for forwards), and counts against the cap of its sender and
of every receiver, so NIC-bound updates and NVLink-bound forwards overlap.
"""

from __future__ import annotations

from itertools import chain

from weightbridge.plan.cost import flows_seconds
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.types import ROLLOUT, TRAINER, Bucket, Round, WireItem

FILL = 0.95


def _num_rounds(maxload: int, cap: int) -> int:
    return max(1, -(-maxload // max(1, int(cap * FILL))))


def pack(bld, packets: list, xpackets: list, xdeps: list) -> list[int]:
    """Round of every packet (``packets`` then ``xpackets``)."""
    cap = bld.cap
    templates = bld.templates
    send_tot: dict[int, int] = {}
    common_tot: dict[tuple[int, int], int] = {}
    extra_tot: dict[tuple[int, int, int], int] = {}
    for s, w, kind, g, l, i, b, _ in packets:
        send_tot[s] = send_tot.get(s, 0) + w
        if kind == 0:
            common_tot[(g, l)] = common_tot.get((g, l), 0) + b
        else:
            extra_tot[(g, i, l)] = extra_tot.get((g, i, l), 0) + b
    xs_tot: dict[int, int] = {}
    for s, w, kind, g, l, i, b, _ in xpackets:
        xs_tot[(g, i, l)] = xs_tot.get((g, i, l), 0) + w
        extra_tot[(g, i, l)] = extra_tot.get((g, i, l), 0) + w
        for m_ in range(len(templates[g].ranks)):
            if m_ != i:
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
    nu = n - 1 if (xpackets and n > 1) else n
    nr = n
    sl: dict[int, list[int]] = {}
    common: dict[tuple[int, int], list[int]] = {}
    mx: dict[tuple[int, int], list[int]] = {}
    extra: dict[tuple[int, int, int], list[int]] = {}
    cum: dict = {}
    out = [0] * (len(packets) + len(xpackets))

    def grow(lst: list[int], upto: int) -> None:
        if upto >= len(lst):
            lst.extend([0] * (upto + 1 - len(lst)))

    for idx, (s, w, kind, g, l, i, b, _) in enumerate(packets):
        c = cum.get(s, 0)
        cum[s] = c + w
        d = int((c + w / 2) * nu / send_tot[s])
        if d >= nu:
            d = nu - 1
        ls = sl.get(s)
        if ls is None:
            ls = sl[s] = [0] * n
        key = (g, l)
        cm = common.get(key)
        if cm is None:
            cm = common[key] = [0] * n
            mx[key] = [0] * n
        m = mx[key]
        if kind == 1:
            ekey = (g, i, l)
            ex = extra.get(ekey)
            if ex is None:
                ex = extra[ekey] = [0] * n
        rho = -1
        # fast path: the wanted round has room (lists are at least n long, d < n)
        if ls[d] + w <= cap and cm[d] + (m[d] if kind == 0 else ex[d]) + b <= cap:
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
                if kind == 0:
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
            if kind == 1:
                grow(ex, rho)
        ls[rho] += w
        if kind == 0:
            cm[rho] += b
        else:
            ex[rho] += b
            if ex[rho] > m[rho]:
                m[rho] = ex[rho]
        out[idx] = rho
    # exchanges: after the rounds their data arrives in; a rollout rank's sent + received count
    base = len(packets)
    cum = {}
    slot_lists: dict[tuple[int, int], list[list[int]]] = {}
    for idx, (s, w, kind, g, l, i, b, _) in enumerate(xpackets):
        skey = (g, i, l)
        c = cum.get(skey, 0)
        cum[skey] = c + w
        first = 1 + max((out[p] for p in xdeps[idx]), default=-1)
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
            for lst in lists:
                if lst is not mine and lst[r] > lim:
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
        for lst in lists:
            lst[rho] += b
        mine[rho] += w - b
        out[base + idx] = rho
    used = sorted(set(out))
    if used and used[-1] != len(used) - 1:
        remap = {r: k for k, r in enumerate(used)}
        out = [remap[r] for r in out]
    return out


def assemble(bld, packets: list, xpackets: list, rounds_of: list[int]) -> tuple[Round, ...]:
    """Buckets per (round, sender, receiver); items in packet order, template items first."""
    templates = bld.templates
    tl: dict[tuple, list] = {}  # key -> [items..., ] with running bytes in nb
    tb: dict[tuple, int] = {}
    pl: dict[tuple, list[WireItem]] = {}
    pb: dict[tuple, int] = {}
    xl: dict[tuple, list[WireItem]] = {}
    xb: dict[tuple, int] = {}
    for (s, w, kind, g, l, i, b, items), rho in zip(packets, rounds_of):
        if kind == 0:
            key = (rho, s, g, l)
            lst, acc = tl, tb
        else:
            key = (rho, s, templates[g].ranks[i][l])
            lst, acc = pl, pb
        cur = lst.get(key)
        if cur is None:
            lst[key] = list(items)
            acc[key] = b
        else:
            cur.extend(items)
            acc[key] += b
    for (s, w, kind, g, l, i, b, items), rho in zip(xpackets, rounds_of[len(packets):]):
        key = (rho, s, g, l, i)
        cur = xl.get(key)
        if cur is None:
            xl[key] = list(items)
            xb[key] = b
        else:
            cur.extend(items)
            xb[key] += b
    per_round: dict[int, list[Bucket]] = {}
    new = tuple.__new__
    for key, lst in tl.items():
        rho, s, g, l = key
        tt = tuple(lst)
        nb = tb[key]
        bl = per_round.get(rho)
        if bl is None:
            bl = per_round[rho] = []
        if not pl:
            bl.extend([new(Bucket, (TRAINER, s, ranks[l], tt, nb)) for ranks in templates[g].ranks])
            continue
        for ranks in templates[g].ranks:
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
        for m_, ranks in enumerate(templates[g].ranks):
            if m_ != i:
                bl.append(Bucket(ROLLOUT, s, ranks[l], tt, nb))
    out = []
    for rho in sorted(per_round):
        bl = per_round[rho]
        bl.sort()  # (src_side, sender, receiver) is unique within a round; update and exchange never share one
        out.append(Round(rho, tuple(bl)))
    return tuple(out)


def decide_dedup(bld, net: NetworkModel) -> tuple[bool, str]:
    """Price the update with and without receiver de-replication; use it only if >= 10% faster.

    Estimated from chunk bytes, with replicated atoms split evenly among their holders.
    """
    from weightbridge.layout.box import box_numel
    from weightbridge.layout.ir import dtype_bytes

    templates = bld.templates
    per_atom: dict[tuple[tuple[int, ...], int, int], float] = {}  # (holder ranks, g, l) -> bytes per instance
    for atom, chunk_list in bld.chunks:
        hk = tuple(h[0] for h in atom.holders)
        for g, l, cbox, dt, dp in chunk_list:
            key = (hk, g, l)
            per_atom[key] = per_atom.get(key, 0) + box_numel(cbox) * dtype_bytes(dt.dtype)
    agg: dict[tuple[int, int, int], float] = {}  # (s, g, l) -> bytes per instance
    for (hk, g, l), b in per_atom.items():
        share = b / len(hk)
        for s in hk:
            key = (s, g, l)
            agg[key] = agg.get(key, 0) + share
    slot_tot: dict[tuple[int, int], float] = {}
    if not net.colocated:  # trainer -> rollout is always NIC to NIC: sum per rank, no per-instance flows
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
    xflows = []
    for (g, l), per_inst in slot_tot.items():
        ranks = templates[g].ranks
        share = per_inst / len(ranks)
        for i, a in enumerate(ranks):
            for m_, bb in enumerate(ranks):
                if m_ != i:
                    xflows.append((ROLLOUT, a[l], ROLLOUT, bb[l], share))
    # forwarding adds at least one round and (instances - 1) messages per rank
    most = max((len(t.ranks) for t in templates), default=1)
    t_dedup = t_update + flows_seconds(xflows, net) + net.message_latency_s * most
    use = t_dedup < 0.9 * t_plain
    note = (
        f"receiver de-replication {'on' if use else 'off'}: estimated {t_dedup:.3g}s with vs {t_plain:.3g}s without"
    )
    return use, note
