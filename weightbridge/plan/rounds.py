"""Round packing, bucket assembly and the receiver de-replication decision.

**Packing.** ``N = ceil(max rank bytes / (0.95 * round_bytes))`` rounds are planned. Packets
are visited in canonical order; a packet carrying sender ``s``'s bytes ``[c, c + w)`` of its
total ``T_s`` wants round ``floor((c + w/2) / T_s * N)``: every sender spreads its bytes
evenly over the rounds, and so every receiver, which hears from many senders, does too.
A packet goes to the first round from the wanted one on (then backwards, then a new round)
where no rank of it exceeds ``round_bytes`` (sent + received). Receivers of a template are
tracked as ``common[slot][round] + extra[instance, slot][round]``, so checking a packet that
goes to all instances costs O(1).

Exchange packets (receiver de-replication) are packed the same way into rounds after every
update round, so a rollout rank only forwards data it already holds.
"""

from __future__ import annotations

from itertools import chain

from weightbridge.plan.cost import flows_seconds
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.types import ROLLOUT, TRAINER, Bucket, Round, WireItem

FILL = 0.95


def _num_rounds(maxload: int, cap: int) -> int:
    return max(1, -(-maxload // int(cap * FILL)))


def pack(bld, packets: list, xpackets: list) -> tuple[list[int], int]:
    """Round of every packet (``packets`` then ``xpackets``) and the number of update rounds."""
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
    recv = dict.fromkeys(((g, i, l) for g, t in enumerate(templates) for i in range(len(t.ranks))
                          for l in range(len(t.layouts))), 0)
    for (g, i, l), b in extra_tot.items():
        recv[(g, i, l)] += b
    for (g, l), b in common_tot.items():
        for i in range(len(templates[g].ranks)):
            recv[(g, i, l)] += b
    maxload = max([1, *send_tot.values(), *recv.values()])
    n = _num_rounds(maxload, cap)
    nr = n
    sl: dict[int, list[int]] = {}
    common: dict[tuple[int, int], list[int]] = {}
    mx: dict[tuple[int, int], list[int]] = {}
    extra: dict[tuple[int, int, int], list[int]] = {}
    cum: dict[int, int] = {}
    out = [0] * (len(packets) + len(xpackets))

    def grow(lst: list[int], upto: int) -> None:
        if upto >= len(lst):
            lst.extend([0] * (upto + 1 - len(lst)))

    for idx, (s, w, kind, g, l, i, b, _) in enumerate(packets):
        c = cum.get(s, 0)
        cum[s] = c + w
        d = int((c + w / 2) * n / send_tot[s])
        if d >= n:
            d = n - 1
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
        for r in chain(range(d, nr), range(d - 1, -1, -1)):
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
    used = sorted(set(out[: len(packets)])) if packets else []
    remap = {r: k for k, r in enumerate(used)}
    for idx in range(len(packets)):
        out[idx] = remap[out[idx]]
    nupdate = len(used)
    if not xpackets:
        return out, nupdate
    # exchange rounds: per rollout rank, sent + received
    xs_tot: dict[int, int] = {}
    for s, w, *_ in xpackets:
        xs_tot[s] = xs_tot.get(s, 0) + w
    xload: dict[int, int] = {}
    for s, w, kind, g, l, i, b, _ in xpackets:
        xload[s] = xload.get(s, 0) + w
        for m_, ranks in enumerate(templates[g].ranks):
            if m_ != i:
                xload[ranks[l]] = xload.get(ranks[l], 0) + b
    n = _num_rounds(max(xload.values()), cap)
    nr = n
    rl: dict[int, list[int]] = {}
    cum = {}
    base = len(packets)
    for idx, (s, w, kind, g, l, i, b, _) in enumerate(xpackets):
        c = cum.get(s, 0)
        cum[s] = c + w
        d = min(n - 1, int((c + w / 2) * n / xs_tot[s]))
        peers = [ranks[l] for m_, ranks in enumerate(templates[g].ranks) if m_ != i]
        lists = [rl.setdefault(x, []) for x in (s, *peers)]
        rho = -1
        for r in chain(range(d, nr), range(d - 1, -1, -1)):
            for lst in lists:
                grow(lst, r)
            if lists[0][r] + w > cap or any(lst[r] + b > cap for lst in lists[1:]):
                continue
            rho = r
            break
        if rho < 0:
            rho = nr
            nr += 1
            for lst in lists:
                grow(lst, rho)
        lists[0][rho] += w
        for lst in lists[1:]:
            lst[rho] += b
        out[base + idx] = rho
    used = sorted(set(out[base:]))
    remap = {r: nupdate + k for k, r in enumerate(used)}
    for idx in range(base, len(out)):
        out[idx] = remap[out[idx]]
    return out, nupdate


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


def decide_dedup(bld, packets: list, net: NetworkModel) -> tuple[bool, str]:
    """Price the update with and without receiver de-replication; use it only if >= 10% faster."""
    templates = bld.templates
    agg: dict[tuple[int, int, int, int], int] = {}  # (s, g, l, i|-1) -> bytes per receiver
    for s, w, kind, g, l, i, b, _ in packets:
        key = (s, g, l, i if kind == 1 else -1)
        agg[key] = agg.get(key, 0) + b
    plain = []
    dedup = []
    slot_tot: dict[tuple[int, int], int] = {}
    for (s, g, l, i), b in agg.items():
        ranks = templates[g].ranks
        ninst = len(ranks)
        targets = range(ninst) if i < 0 else (i,)
        for x in targets:
            plain.append((TRAINER, s, ROLLOUT, ranks[x][l], b))
        tot = b * len(targets)
        if ninst > 1:
            for x in range(ninst):  # each unit crosses from trainers once, 1/ninst to each instance
                dedup.append((TRAINER, s, ROLLOUT, ranks[x][l], tot // (ninst * ninst)))
            slot_tot[(g, l)] = slot_tot.get((g, l), 0) + tot // ninst
        else:
            dedup.extend((TRAINER, s, ROLLOUT, ranks[x][l], b) for x in targets)
    t_plain = flows_seconds(plain, net)
    t_update = flows_seconds(dedup, net)
    xflows = []
    for (g, l), per_inst in slot_tot.items():
        ranks = templates[g].ranks
        share = per_inst // len(ranks)
        for i, a in enumerate(ranks):
            for m_, bb in enumerate(ranks):
                if m_ != i:
                    xflows.append((ROLLOUT, a[l], ROLLOUT, bb[l], share))
    t_dedup = t_update + flows_seconds(xflows, net)
    use = t_dedup < 0.9 * t_plain
    note = (
        f"receiver de-replication {'on' if use else 'off'}: estimated {t_dedup:.3g}s with vs {t_plain:.3g}s without"
    )
    return use, note
