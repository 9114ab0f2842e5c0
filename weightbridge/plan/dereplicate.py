"""Step 4 of the planner: chunks -> packets (units, sender and receiver de-replication).

A chunk is cut into *units* of at most ``round_bytes / UNIT_FRACTION`` per rank (split along the
outermost axis with extent > 1, then inner axes for rows larger than that), so no single tensor
forces an oversized round and packing has room to balance.

**Sender de-replication.** Per atom, all (unit, instance) needs form one byte stream. Its ``k``
holders split it into consecutive segments cut at the nearest row boundary: first evenly over
the NICs the holders use (``nic_of``; NICs taken in order of least bytes assigned so far), then
evenly over a NIC's holders (in order of least bytes): bytes are balanced over NICs, not only
over ranks. With a NIC per rank (the default) that is ``k`` near-equal segments. A unit needed
by a whole template goes out as one packet to all its instances (``instance == ALL_INSTANCES``).

**Receiver de-replication** (per template, ``dedup[g]``). Each unit crosses from the trainers
once into each relay group of its slot (:mod:`.relays`: the instances on one node), to the
group's instance that has received least of that slot so far; a :class:`ForwardPacket` sends it
on from there to the rest of its group.

Input: :class:`Cover`, :data:`Templates`, the per-template de-replication flags, ``round_bytes``
and the relay groups. Output: :class:`Packets`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

from weightbridge.layout.box import Box, box_numel
from weightbridge.layout.ir import DTYPE_BYTES, LocalTensor, Piece, checkpoint_cast, dtype_bytes
from weightbridge.plan.cover import Cover
from weightbridge.plan.geometry import make_items, num_rows, rows, split_box
from weightbridge.plan.instances import Templates
from weightbridge.plan.relays import Relays, group_of, one_group
from weightbridge.plan.sources import Holder
from weightbridge.plan.types import WireItem

# A packet must not take more than this fraction of the round cap of any of its ranks,
# so that packing always has room to balance (large tensors are split to fit).
UNIT_FRACTION = 4

ALL_INSTANCES = -1  # UpdatePacket.instance: every instance of the template receives the items


class UpdatePacket(NamedTuple):
    """Trainer ``sender`` sends ``items`` to slot ``slot`` of one or every instance of template ``template``."""

    sender: int  # trainer rank
    load: int  # bytes the sender sends: nbytes, times the instance count for ALL_INSTANCES
    template: int
    slot: int
    instance: int  # index into the template's instances, or ALL_INSTANCES
    nbytes: int  # bytes each receiver gets
    items: tuple[WireItem, ...]


class ForwardPacket(NamedTuple):
    """Rollout ``sender`` (slot ``slot`` of instance ``instance``) forwards ``items`` to the rest of its relay group."""

    sender: int  # rollout rank
    load: int  # bytes the sender sends: nbytes * len(targets)
    template: int
    slot: int
    instance: int  # the forwarding instance (index into the template's instances)
    nbytes: int  # bytes each receiver gets
    items: tuple[WireItem, ...]
    after: Sequence[int]  # indices of the update packets whose data this forwards
    targets: tuple[int, ...]  # the instances it forwards to (its relay group but itself)


class Packets(NamedTuple):
    updates: tuple[UpdatePacket, ...]  # in canonical order
    forwards: tuple[ForwardPacket, ...]  # empty without receiver de-replication
    sender_bound: int  # no plan of these layouts has a busiest trainer rank sending fewer bytes


class _Unit(NamedTuple):
    box: Box  # canonical frame
    template: int
    slot: int
    instance: int  # or ALL_INSTANCES
    tensor: LocalTensor  # receiver's
    piece: Piece  # receiver's
    dtype: str
    esize: int
    nbytes: int  # per receiver
    load: int  # sender bytes


def make_packets(cover: Cover, templates: Templates, dedup: Sequence[bool], round_bytes: int,
                 sender: int | None = None, slot: tuple[int, int] | None = None,
                 relays: Relays | None = None, nic_of: Callable[[int], Hashable] | None = None,
                 near: Callable[[int, int], int] | None = None, casts: Mapping[str, str] | None = None) -> Packets:
    """Update packets in canonical order, and forward packets where ``dedup[template]``.

    An item's wire dtype is the receiver's local dtype, or the checkpoint's for the canonical
    tensors in ``casts`` (``SideLayout.casts``: their values pass through it, the receiver casts up).

    ``sender`` (a trainer rank) or ``slot`` (``(template, slot)`` of a rollout rank) leave the
    items of every other packet empty: packing needs only sizes, and one rank's slice of the plan
    only its own packets' items (:func:`weightbridge.plan.build.build_rank_plan`). ``relays``:
    the relay groups of receiver de-replication (None: every instance in one group); ``nic_of``:
    a trainer rank's NIC (None: a NIC per rank). ``near(trainer rank, rollout rank)`` (the colocated
    data plane: 2 same GPU, 1 same host, 0 neither): a unit whose receivers have nearer holders than
    others is split among those nearest holders only (:func:`_by_nearness`); the rest among all."""
    if relays is None:
        relays = one_group(templates)
    nics = _Nics(nic_of)
    out: list[UpdatePacket] = []
    xout: list[ForwardPacket] = []
    load: dict[int, int] = {}  # bytes per sender so far
    forced: dict[int, int] = {}  # of which from atoms with one holder
    cap = round_bytes
    unit_cap = max(1, round_bytes // UNIT_FRACTION)
    ninsts = [len(t.ranks) for t in templates]
    anydedup = any(dedup)
    slot_load: dict[tuple[int, int], list[int]] = {}
    new = tuple.__new__  # NamedTuple(...) without the Python-level namedtuple __new__
    def wanted(s: int, g: int, l: int) -> bool:
        return (sender is None or s == sender) and (slot is None or (g, l) == slot)

    casts = casts or {}
    for atom, chunk_list in cover.chunks:
        name, holders = atom.canonical, atom.holders
        via = casts.get(name)
        k = len(holders)
        start = len(out)
        if k == 1 and not anydedup:  # fast path: one holder, template packets
            s, st, sp = holders[0]
            spb = sp.canonical_box
            tot = 0
            for g, l, cbox, dt, dp in chunk_list:
                want = wanted(s, g, l)
                ninst = ninsts[g]
                dtype = (via and checkpoint_cast(dt.dtype, via)) or dt.dtype
                es = DTYPE_BYTES[dtype]
                n = 1
                for a, z in cbox:
                    n *= z - a
                b = n * es
                if b * ninst <= unit_cap:
                    if not want:
                        items = ()
                    elif cbox == spb and cbox == dp.canonical_box:
                        items = (new(WireItem, (name, cbox, st.name, sp.local_box, sp.transpose, dt.name,
                                                dp.local_box, dp.transpose, dtype, b)),)
                    else:
                        items = tuple(make_items(name, cbox, st, sp, dt, dp, dtype, es))
                    out.append(new(UpdatePacket, (s, ninst * b, g, l, ALL_INSTANCES, b, items)))
                    tot += ninst * b
                    continue
                for u in split_box(cbox, max(1, unit_cap // (es * ninst))):
                    b = box_numel(u) * es
                    items = tuple(make_items(name, u, st, sp, dt, dp, dtype, es)) if want else ()
                    if ninst * b <= cap:
                        out.append(new(UpdatePacket, (s, ninst * b, g, l, ALL_INSTANCES, b, items)))
                    else:
                        out.extend(new(UpdatePacket, (s, b, g, l, i, b, items)) for i in range(ninst))
                    tot += ninst * b
            nics.charge(load, s, tot)
            forced[s] = forced.get(s, 0) + tot
            continue
        units: list[_Unit] = []
        for g, l, cbox, dt, dp in chunk_list:
            ninst = ninsts[g]
            dtype = (via and checkpoint_cast(dt.dtype, via)) or dt.dtype
            es = dtype_bytes(dtype)
            dd = dedup[g] and ninst > 1
            for u in split_box(cbox, max(1, unit_cap // (es * ninst))):
                b = box_numel(u) * es
                if dd:  # into each relay group once, to its instance that has received least so far
                    sl = slot_load.get((g, l))
                    if sl is None:
                        sl = slot_load[(g, l)] = [0] * ninst
                    for grp in relays[g][l]:
                        i = min(grp, key=sl.__getitem__)
                        sl[i] += b
                        units.append(new(_Unit, (u, g, l, i, dt, dp, dtype, es, b, b)))
                elif ninst * b <= cap:
                    units.append(new(_Unit, (u, g, l, ALL_INSTANCES, dt, dp, dtype, es, b, ninst * b)))
                else:
                    for i in range(ninst):
                        units.append(new(_Unit, (u, g, l, i, dt, dp, dtype, es, b, b)))
        if k == 1:
            s, st, sp = holders[0]
            tot = 0
            cache: dict[tuple, tuple[WireItem, ...]] = {}
            for ub, g, l, i, dt, dp, dtype, es, b, w in units:
                ckey = (ub, g, l)
                items = cache.get(ckey)
                if items is None:
                    items = cache[ckey] = (tuple(make_items(name, ub, st, sp, dt, dp, dtype, es))
                                           if wanted(s, g, l) else ())
                out.append(new(UpdatePacket, (s, w, g, l, i, b, items)))
                tot += w
            nics.charge(load, s, tot)
            forced[s] = forced.get(s, 0) + tot
        elif near is None:
            _split(name, holders, units, load, out, wanted, nics)
        else:
            for subset, part in _by_nearness(holders, units, templates, near):
                _split(name, subset, part, load, out, wanted, nics)
        if anydedup:
            deps: dict[tuple[int, int, int], list[int]] = {}
            for pi in range(start, len(out)):
                pk = out[pi]
                deps.setdefault((pk.template, pk.slot, pk.instance), []).append(pi)
            for ub, g, l, i, dt, dp, dtype, es, b, w in units:
                if i >= 0 and dedup[g] and ninsts[g] > 1:
                    targets = tuple(x for x in group_of(relays, g, l, i) if x != i)
                    if not targets:
                        continue
                    items = (tuple(make_items(name, ub, dt, dp, dt, dp, dtype, es))
                             if sender is None and (slot is None or (g, l) == slot) else ())
                    xout.append(ForwardPacket(templates[g].ranks[i][l], len(targets) * b, g, l, i, b, items,
                                              deps.get((g, l, i), ()), targets))
    return Packets(tuple(out), tuple(xout), _sender_bound(load, forced))


def _by_nearness(holders: tuple[Holder, ...], units: list[_Unit], templates: Templates,
                 near: Callable[[int, int], int]) -> list[tuple[tuple[Holder, ...], list[_Unit]]]:
    """An atom's units grouped by the holders nearest to all of their receivers: the units whose
    nearest holders are a proper subset go to that subset (same GPU before same host); the others,
    last, to every holder (balanced over all of them by ``_split``). Deterministic: subsets in order."""
    groups: dict[tuple[int, ...], list[_Unit]] = {}
    rest: list[_Unit] = []
    everyone = tuple(range(len(holders)))
    for u in units:
        ranks = templates[u.template].ranks
        receivers = [ranks[u.instance][u.slot]] if u.instance >= 0 else [inst[u.slot] for inst in ranks]
        scores = [min(near(h[0], r) for r in receivers) for h in holders]
        best = max(scores)
        subset = tuple(j for j, sc in enumerate(scores) if sc == best)
        if best == 0 or subset == everyone:
            rest.append(u)
        else:
            groups.setdefault(subset, []).append(u)
    out = [(tuple(holders[j] for j in subset), groups[subset]) for subset in sorted(groups)]
    return out + ([(holders, rest)] if rest else [])


def _sender_bound(load: dict[int, int], forced: dict[int, int]) -> int:
    """A lower bound on the busiest sender's bytes: its unshareable bytes, or the even share."""
    if not load:
        return 0
    even = -(-sum(load.values()) // len(load))
    return max(even, max(forced.values(), default=0))


class _Nics:
    """Bytes per trainer NIC so far (``nic_of`` None: a NIC per rank, the rank's own load)."""

    def __init__(self, nic_of: Callable[[int], Hashable] | None) -> None:
        self.nic_of = nic_of
        self.load: dict[Hashable, int] = {}

    def charge(self, load: dict[int, int], s: int, nbytes: int) -> None:
        load[s] = load.get(s, 0) + nbytes
        if self.nic_of is not None:
            key = self.nic_of(s)
            self.load[key] = self.load.get(key, 0) + nbytes

    def order(self, holders: tuple[Holder, ...], load: dict[int, int]) -> tuple[list[int], list[int]]:
        """Holder indices in sending order and each one's cumulative share (numerator over the last):
        NICs by least load, each an equal share, split equally over its holders by least load."""
        by_rank = sorted(range(len(holders)), key=lambda j: (load.get(holders[j][0], 0), holders[j][0]))
        if self.nic_of is None:
            return by_rank, list(range(1, len(holders) + 1))
        groups: dict[Hashable, list[int]] = {}
        for j in by_rank:
            groups.setdefault(self.nic_of(holders[j][0]), []).append(j)
        keys = sorted(groups, key=lambda c: (self.load.get(c, 0), holders[groups[c][0]][0]))
        size = math.lcm(*(len(groups[key]) for key in keys))  # shares: per NIC `size`, split over its holders
        order, ends = [], []
        for gi, key in enumerate(keys):
            members = groups[key]
            for hi, j in enumerate(members):
                order.append(j)
                ends.append(gi * size + (hi + 1) * size // len(members))
        return order, ends


def _split(name: str, holders: tuple[Holder, ...], units: list[_Unit], load: dict[int, int],
           out: list[UpdatePacket], wanted: Callable[[int, int, int], bool], nics: _Nics) -> None:
    """Split the atom's stream among its holders (module docstring), cuts on row boundaries."""
    k = len(holders)
    order, ends = nics.order(holders, load)
    last = ends[-1]
    total = sum(e.load for e in units)
    cache: dict[tuple, tuple[WireItem, ...]] = {}
    new = tuple.__new__
    j = 0
    target = total * ends[0] // last
    pos = 0
    sent = [0] * k
    for ub, g, l, i, dt, dp, dtype, es, b, w in units:
        nr = num_rows(ub)
        rb = w // nr  # sender bytes per row
        r0 = 0
        while r0 < nr:
            if j < k - 1:
                cut = (2 * (target - pos) + rb) // (2 * rb)  # nearest row boundary to the target
                cut = min(max(cut, r0), nr)
            else:
                cut = nr
            if cut > r0:
                hj = order[j]
                s, st, sp = holders[hj]
                key = (hj, ub, g, l, r0, cut)
                items = cache.get(key)
                if items is None:
                    sub = ub if (r0 == 0 and cut == nr) else rows(ub, r0, cut)
                    items = cache[key] = (tuple(make_items(name, sub, st, sp, dt, dp, dtype, es))
                                          if wanted(s, g, l) else ())
                nw = (cut - r0) * rb
                out.append(new(UpdatePacket, (s, nw, g, l, i, b * (cut - r0) // nr, items)))
                sent[hj] += nw
            if cut < nr:
                j += 1
                target = total * ends[j] // last
            r0 = cut
        pos += w
    for hj in range(k):
        if sent[hj]:
            nics.charge(load, holders[hj][0], sent[hj])


__all__ = ["ALL_INSTANCES", "UNIT_FRACTION", "ForwardPacket", "Packets", "UpdatePacket", "make_packets"]
