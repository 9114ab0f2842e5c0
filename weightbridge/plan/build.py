"""``build_plan``: trainer layout x rollout layout -> :class:`TransferPlan`.

The pipeline (each stage a pure function; see ``docs/planner.md``):

1. :func:`index_sources` — per canonical tensor, the disjoint *atoms* (boxes) trainers hold and,
   per atom, its *holders* (replicas), deduplicated per rank.
2. :func:`group_instances` — rollout instances with identical layouts share one *template*.
3. :func:`receiver_needs` — per template slot (local rank), the canonical boxes it needs, each
   once (receiver-local duplicates become :class:`LocalCopy`).
4. Per atom, every (template slot, chunk, unit, instance) that needs it forms a byte stream;
   ``k`` holders split the stream into ``k`` near-equal parts cut at row boundaries (the
   least-loaded holder first), so replicas share the work within one row.
5. Packets (one sender, a few items, one or all instances of a template) are packed into
   rounds under the per-rank cap (:mod:`weightbridge.plan.rounds`).
6. Optional receiver de-replication (exchange rounds), chosen by the cost model under ``auto``.
7. Buckets are assembled per (round, sender, receiver) and the plan is hashed.

Everything iterates in sorted, deterministic order; no set or dict order leaks into the plan.
"""

from __future__ import annotations

import gc
import hashlib
import marshal
import time
from operator import itemgetter
from collections.abc import Sequence
from typing import Literal, NamedTuple

from weightbridge.layout.box import Box, box_numel, intersect, is_empty
from weightbridge.layout.ir import DTYPE_BYTES, LocalTensor, Piece, RankLayout, SideLayout, dtype_bytes
from weightbridge.plan.geometry import map_to_local, num_rows, rows, split_box, subtract_all
from weightbridge.plan.network import PRESETS, NetworkModel
from weightbridge.plan.types import LocalCopy, Round, TransferPlan, WireItem

PLANNER_VERSION = "weightbridge-plan/1"

# A packet must not take more than this fraction of the round cap of any of its ranks,
# so that packing always has room to balance (large tensors are split to fit).
UNIT_FRACTION = 4

Holder = tuple[int, LocalTensor, Piece]


class Atom(NamedTuple):
    """A canonical box held identically by ``holders`` (trainer ranks, ascending)."""

    canonical: str
    box: Box  # frame: canonical tensor
    holders: tuple[Holder, ...]


class Template(NamedTuple):
    """Rollout instances with identical layouts.

    ``layouts[l]`` is slot ``l`` (local rank order) of the first instance; ``ranks[i][l]`` the
    rollout rank of slot ``l`` in the template's ``i``-th instance.
    """

    layouts: tuple[RankLayout, ...]
    ranks: tuple[tuple[int, ...], ...]
    instances: tuple[int, ...]


class Need(NamedTuple):
    canonical: str
    box: Box  # canonical frame; disjoint from every other need of the same slot
    tensor: LocalTensor
    piece: Piece


# ---------------------------------------------------------------------------
# 1. sources
# ---------------------------------------------------------------------------


def index_sources(trainer: SideLayout) -> dict[str, list[Atom]]:
    """Per canonical tensor, disjoint atoms with their holders (one piece per holder rank)."""
    first: dict[str, tuple[Box, int, LocalTensor, Piece]] = {}  # the one piece of most tensors
    more: dict[str, list[tuple[Box, int, LocalTensor, Piece]]] = {}
    for lay in trainer.ranks:
        rank = lay.rank
        for t in lay.tensors:
            for p in t.pieces:  # empty pieces become atoms no need ever intersects
                name = p.canonical
                if name in first:
                    lst = more.get(name)
                    if lst is None:
                        more[name] = [first[name], (p.canonical_box, rank, t, p)]
                    else:
                        lst.append((p.canonical_box, rank, t, p))
                else:
                    first[name] = (p.canonical_box, rank, t, p)
    out: dict[str, list[Atom]] = {}
    for name, (box, rank, t, p) in first.items():
        lst = more.get(name)
        if lst is None:
            out[name] = [Atom(name, box, ((rank, t, p),))]
            continue
        by_box: dict[Box, dict[int, tuple[LocalTensor, Piece]]] = {}
        for box, rank, t, p in lst:
            by_box.setdefault(box, {}).setdefault(rank, (t, p))
        boxes = sorted(by_box)
        if len(boxes) == 1 or _pairwise_disjoint(boxes):
            out[name] = [Atom(name, b, _holders(by_box[b])) for b in boxes]
        else:
            out[name] = _refine(name, boxes, by_box)
    return out


def _holders(d: dict[int, tuple[LocalTensor, Piece]]) -> tuple[Holder, ...]:
    if len(d) == 1:
        for r, (t, p) in d.items():
            return ((r, t, p),)
    return tuple((r, t, p) for r, (t, p) in sorted(d.items(), key=lambda kv: kv[0]))


def _pairwise_disjoint(boxes: Sequence[Box]) -> bool:
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if intersect(boxes[i], boxes[j]) is not None:
                return False
    return True


def _refine(name: str, boxes: list[Box], by_box: dict) -> list[Atom]:
    """Partially overlapping replica classes: cut on every class edge, holders = classes containing the cell."""
    ndim = len(boxes[0])
    cuts = [sorted({x for b in boxes for x in b[d]}) for d in range(ndim)]
    cells: list[Box] = [()]
    for d in range(ndim):
        cells = [c + ((lo, hi),) for c in cells for lo, hi in zip(cuts[d], cuts[d][1:])]
    atoms = []
    for cell in cells:
        merged: dict[int, tuple[LocalTensor, Piece]] = {}
        for b in boxes:
            if all(a0 <= c0 and c1 <= a1 for (a0, a1), (c0, c1) in zip(b, cell)):
                for r, tp in by_box[b].items():
                    merged.setdefault(r, tp)
        if merged:
            atoms.append(Atom(name, cell, _holders(merged)))
    return atoms


# ---------------------------------------------------------------------------
# 2. rollout templates
# ---------------------------------------------------------------------------


def group_instances(rollout: SideLayout) -> list[Template]:
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
    return [Template(rep, tuple(ranks), tuple(insts)) for rep, insts, ranks in groups]


# ---------------------------------------------------------------------------
# 3. receiver needs
# ---------------------------------------------------------------------------


def receiver_needs(lay: RankLayout) -> tuple[list[Need], list[tuple]]:
    """Canonical boxes one rollout rank needs, each element once, plus its local copies.

    Local copies are returned rank-less as ``LocalCopy`` field tuples without the rank.
    """
    by_name: dict[str, list[tuple[LocalTensor, Piece]]] = {}
    for t in lay.tensors:
        for p in t.pieces:
            if not is_empty(p.canonical_box):
                by_name.setdefault(p.canonical, []).append((t, p))
    needs: list[Need] = []
    copies: list[tuple] = []
    for name in sorted(by_name):
        tps = by_name[name]
        if len(tps) == 1:
            t, p = tps[0]
            needs.append(Need(name, p.canonical_box, t, p))
            continue
        seen: list[tuple[Box, LocalTensor, Piece]] = []
        for t, p in tps:
            box = p.canonical_box
            for part in subtract_all(box, [b for b, _, _ in seen]):
                needs.append(Need(name, part, t, p))
            for b, t0, p0 in seen:
                ov = intersect(box, b)
                if ov is None:
                    continue
                for part in subtract_all(ov, [x for x, _, _ in seen[: seen.index((b, t0, p0))]]):
                    for it in make_items(name, part, t0, p0, t, p, t.dtype, 0):
                        copies.append((name, it.canonical_box, it.src_tensor, it.src_box, it.src_transpose,
                                       it.dst_tensor, it.dst_box, it.dst_transpose))
            seen.append((box, t, p))
    return needs, copies


# ---------------------------------------------------------------------------
# items
# ---------------------------------------------------------------------------


def make_items(
    name: str, box: Box, st: LocalTensor, sp: Piece, dt: LocalTensor, dp: Piece, dtype: str, esize: int
) -> list[WireItem]:
    """Items moving ``box`` (canonical frame) from piece ``sp`` of ``st`` to piece ``dp`` of ``dt``.

    One item unless ``box`` is not a single box in one of the local frames; then it is cut
    into parts that are boxes in both.
    """
    if box == sp.canonical_box and box == dp.canonical_box:
        return [WireItem(name, box, st.name, sp.local_box, sp.transpose, dt.name, dp.local_box, dp.transpose, dtype,
                         box_numel(box) * esize)]
    out: list[WireItem] = []

    def emit(c: Box) -> None:
        s = map_to_local(c, sp)
        if len(s) > 1:
            for cc, _ in s:
                emit(cc)
            return
        d = map_to_local(c, dp)
        if len(d) > 1:
            for cc, _ in d:
                emit(cc)
            return
        out.append(WireItem(name, c, st.name, s[0][1], sp.transpose, dt.name, d[0][1], dp.transpose, dtype,
                            box_numel(c) * esize))

    emit(box)
    return out


# ---------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------

# Packet: (sender, send_load, kind, g, l, i, b, items)
#   kind 0: template packet, every instance of template g gets ``items`` (b bytes) at slot l from sender
#   kind 1: one instance i of template g at slot l
#   kind 2: exchange: rollout slot l of instance i sends ``items`` to the other instances of g
Packet = tuple


class _Builder:
    def __init__(self, trainer: SideLayout, rollout: SideLayout, round_bytes: int, net: NetworkModel):
        self.trainer, self.rollout, self.cap, self.net = trainer, rollout, round_bytes, net
        self.unit_cap = max(1, round_bytes // UNIT_FRACTION)
        self.sources = index_sources(trainer)
        self.templates = group_instances(rollout)
        self.needs: list[list[list[Need]]] = []  # [g][l] -> needs
        self.copies: list[LocalCopy] = []
        self.min_wire = 0
        by_name: dict[str, list[tuple[int, int, Need]]] = {}
        for g, tpl in enumerate(self.templates):
            per_slot = []
            ninst = len(tpl.ranks)
            for l, lay in enumerate(tpl.layouts):
                nbytes = 0
                names = [p.canonical for t in lay.tensors for p in t.pieces]
                if len(set(names)) == len(names):  # usual case: each canonical tensor once on this rank
                    needs = []
                    for t in lay.tensors:
                        es = DTYPE_BYTES[t.dtype]
                        for p in t.pieces:
                            box = p.canonical_box
                            n = 1
                            for a, z in box:
                                n *= z - a
                            if n <= 0:
                                continue
                            nbytes += n * es
                            need = Need(p.canonical, box, t, p)
                            needs.append(need)
                            lst = by_name.get(p.canonical)
                            if lst is None:
                                by_name[p.canonical] = [(g, l, need)]
                            else:
                                lst.append((g, l, need))
                else:
                    needs, copies = receiver_needs(lay)
                    for inst_ranks in tpl.ranks:
                        self.copies.extend(LocalCopy(inst_ranks[l], *c) for c in copies)
                    for n in needs:
                        nbytes += box_numel(n.box) * dtype_bytes(n.tensor.dtype)
                        by_name.setdefault(n.canonical, []).append((g, l, n))
                per_slot.append(needs)
                self.min_wire += ninst * nbytes
            self.needs.append(per_slot)
        # chunks grouped by atom, atoms in canonical order
        self.chunks: list[tuple[Atom, list[tuple[int, int, Box, LocalTensor, Piece]]]] = []
        sources = self.sources
        for name in sorted(by_name):
            atoms = sources.get(name)
            if not atoms:
                continue
            lst = by_name[name]
            if len(atoms) == 1:
                ab = atoms[0].box
                out = []
                for g, l, n in lst:
                    c = n.box if n.box == ab else intersect(n.box, ab)
                    if c is not None:
                        out.append((g, l, c, n.tensor, n.piece))
                if out:
                    self.chunks.append((atoms[0], out))
                continue
            for atom in atoms:
                out = []
                for g, l, n in lst:
                    c = intersect(n.box, atom.box)
                    if c is not None:
                        out.append((g, l, c, n.tensor, n.piece))
                if out:
                    self.chunks.append((atom, out))

    # -- 4. packets ---------------------------------------------------------
    def packets(self, dedup: Sequence[bool]) -> list[Packet]:
        """Trainer -> rollout packets (kinds 0, 1) in canonical order; exchange packets kept in ``self.xpackets``."""
        out: list[Packet] = []
        xout: list[Packet] = []
        load: dict[int, int] = {}  # bytes per sender so far
        forced: dict[int, int] = {}  # of which from atoms with one holder
        self.load, self.forced = load, forced
        cap, unit_cap = self.cap, self.unit_cap
        templates = self.templates
        ninsts = [len(t.ranks) for t in templates]
        anydedup = any(dedup)
        slot_load: dict[tuple[int, int], list[int]] = {}
        xdeps: list = []  # per exchange packet: indices of the update packets it forwards from
        new = tuple.__new__  # WireItem(...) without the Python-level namedtuple __new__
        for atom, chunk_list in self.chunks:
            name, holders = atom.canonical, atom.holders
            k = len(holders)
            start = len(out)
            if k == 1 and not anydedup:  # fast path: one holder, template packets
                s, st, sp = holders[0]
                spb = sp.canonical_box
                tot = 0
                for g, l, cbox, dt, dp in chunk_list:
                    ninst = ninsts[g]
                    dtype = dt.dtype
                    es = DTYPE_BYTES[dtype]
                    n = 1
                    for a, z in cbox:
                        n *= z - a
                    b = n * es
                    if b * ninst <= unit_cap:
                        if cbox == spb and cbox == dp.canonical_box:
                            items = (new(WireItem, (name, cbox, st.name, sp.local_box, sp.transpose, dt.name,
                                                    dp.local_box, dp.transpose, dtype, b)),)
                        else:
                            items = tuple(make_items(name, cbox, st, sp, dt, dp, dtype, es))
                        out.append((s, ninst * b, 0, g, l, -1, b, items))
                        tot += ninst * b
                        continue
                    for u in split_box(cbox, max(1, unit_cap // (es * ninst))):
                        b = box_numel(u) * es
                        items = tuple(make_items(name, u, st, sp, dt, dp, dtype, es))
                        if ninst * b <= cap:
                            out.append((s, ninst * b, 0, g, l, -1, b, items))
                        else:
                            out.extend((s, b, 1, g, l, i, b, items) for i in range(ninst))
                        tot += ninst * b
                load[s] = load.get(s, 0) + tot
                forced[s] = forced.get(s, 0) + tot
                continue
            entries = []  # (box, g, l, i or -1, dt, dp, dtype, es, nbytes per receiver, sender load)
            for g, l, cbox, dt, dp in chunk_list:
                ninst = ninsts[g]
                dtype = dt.dtype
                es = dtype_bytes(dtype)
                dd = dedup[g] and ninst > 1
                for u in split_box(cbox, max(1, unit_cap // (es * ninst))):
                    b = box_numel(u) * es
                    if dd:  # the unit crosses once, to the instance that has received least so far
                        sl = slot_load.get((g, l))
                        if sl is None:
                            sl = slot_load[(g, l)] = [0] * ninst
                        i = sl.index(min(sl))
                        sl[i] += b
                        entries.append((u, g, l, i, dt, dp, dtype, es, b, b))
                    elif ninst * b <= cap:
                        entries.append((u, g, l, -1, dt, dp, dtype, es, b, ninst * b))
                    else:
                        for i in range(ninst):
                            entries.append((u, g, l, i, dt, dp, dtype, es, b, b))
            if k == 1:
                s, st, sp = holders[0]
                tot = 0
                cache: dict[tuple, tuple[WireItem, ...]] = {}
                for ub, g, l, i, dt, dp, dtype, es, b, w in entries:
                    ckey = (ub, g, l)
                    items = cache.get(ckey)
                    if items is None:
                        items = cache[ckey] = tuple(make_items(name, ub, st, sp, dt, dp, dtype, es))
                    out.append((s, w, 0 if i < 0 else 1, g, l, i, b, items))
                    tot += w
                load[s] = load.get(s, 0) + tot
                forced[s] = forced.get(s, 0) + tot
            else:
                self._split(name, holders, entries, load, out)
            if anydedup:
                deps: dict[tuple[int, int, int], list[int]] = {}
                for pi in range(start, len(out)):
                    pk = out[pi]
                    deps.setdefault((pk[3], pk[4], pk[5]), []).append(pi)
                for ub, g, l, i, dt, dp, dtype, es, b, w in entries:
                    if i >= 0 and dedup[g] and ninsts[g] > 1:
                        items = tuple(make_items(name, ub, dt, dp, dt, dp, dtype, es))
                        xout.append((templates[g].ranks[i][l], (ninsts[g] - 1) * b, 2, g, l, i, b, items))
                        xdeps.append(deps.get((g, l, i), ()))
        self.xpackets = xout
        self.xdeps = xdeps
        return out

    def sender_bound(self) -> int:
        """A lower bound on the busiest sender's bytes: its unshareable bytes, or the even share."""
        if not self.load:
            return 0
        even = -(-sum(self.load.values()) // len(self.load))
        return max(even, max(self.forced.values(), default=0))

    def _split(self, name: str, holders: tuple[Holder, ...], entries: list, load: dict[int, int], out: list) -> None:
        """Split the atom's stream among its holders: near-equal bytes, cuts on row boundaries."""
        k = len(holders)
        order = sorted(range(k), key=lambda j: (load.get(holders[j][0], 0), holders[j][0]))
        total = sum(e[9] for e in entries)
        cache: dict[tuple, tuple[WireItem, ...]] = {}
        j = 0
        target = total // k
        pos = 0
        sent = [0] * k
        for eidx, (ub, g, l, i, dt, dp, dtype, es, b, w) in enumerate(entries):
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
                        items = cache[key] = tuple(make_items(name, sub, st, sp, dt, dp, dtype, es))
                    nw = (cut - r0) * rb
                    out.append((s, nw, 0 if i < 0 else 1, g, l, i, b * (cut - r0) // nr, items))
                    sent[hj] += nw
                if cut < nr:
                    j += 1
                    target = total * (j + 1) // k
                r0 = cut
            pos += w
        for hj in range(k):
            if sent[hj]:
                s = holders[hj][0]
                load[s] = load.get(s, 0) + sent[hj]


def build_plan(
    trainer: SideLayout,
    rollout: SideLayout,
    *,
    round_bytes: int,
    network: NetworkModel | None = None,
    receiver_dedup: Literal["auto", "on", "off"] = "auto",
) -> TransferPlan:
    """Plan one weight update from ``trainer`` ranks to ``rollout`` ranks.

    ``round_bytes`` caps the wire bytes (sent + received) of every rank in every round.
    ``network`` (default: the ``h100`` preset) prices receiver de-replication when
    ``receiver_dedup="auto"``; ``"on"``/``"off"`` force it. Call order: every trainer and
    rollout rank calls this with the same layouts and arguments, then compares
    :attr:`TransferPlan.plan_hash` with its peers before executing (a mismatch means the
    ranks disagree on layouts or planner version).

    Pure and deterministic. Never raises for an incomplete layout pair (elements nobody
    holds are simply not sent): run :func:`weightbridge.plan.validate_plan` to get every problem.
    """

    t0 = time.perf_counter()
    if round_bytes <= 0:
        raise ValueError(f"round_bytes must be positive, got {round_bytes}")
    if receiver_dedup not in ("auto", "on", "off"):
        raise ValueError(f"receiver_dedup must be auto, on or off, got {receiver_dedup!r}")
    net = network or PRESETS["h100"]
    # The build allocates ~1e6 small acyclic tuples next to a large live layout; generational
    # GC passes over that heap cost more than the build itself, so pause GC while building.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(trainer, rollout, round_bytes, net, receiver_dedup, t0)
    finally:
        if was_enabled:
            gc.enable()


def _build(trainer, rollout, round_bytes, net, receiver_dedup, t0) -> TransferPlan:
    from weightbridge.plan.rounds import assemble, decide_dedup, pack

    bld = _Builder(trainer, rollout, round_bytes, net)
    ntpl = len(bld.templates)
    notes: list[str] = []
    dedup = [False] * ntpl
    if receiver_dedup == "on":
        dedup = [len(t.ranks) > 1 for t in bld.templates]
    elif receiver_dedup == "auto" and any(len(t.ranks) > 1 for t in bld.templates):
        use, note = decide_dedup(bld, net)
        notes.append(note)
        if use:
            dedup = [len(t.ranks) > 1 for t in bld.templates]
    packets = bld.packets(dedup)
    rounds_of = pack(bld, packets, bld.xpackets, bld.xdeps)
    rounds = assemble(bld, packets, bld.xpackets, rounds_of)
    copies = tuple(sorted(bld.copies))
    header = (PLANNER_VERSION, round_bytes, trainer.world_size, rollout.world_size, any(dedup), bld.min_wire)
    plan = TransferPlan(
        rounds=rounds,
        local_copies=copies,
        round_bytes=round_bytes,
        num_senders=trainer.world_size,
        num_receivers=rollout.world_size,
        receiver_dedup=any(dedup),
        min_wire_bytes=bld.min_wire,
        max_sender_bytes_bound=bld.sender_bound(),
        plan_hash=plan_hash(header, rounds, copies),
        notes=tuple(notes),
    )
    object.__setattr__(plan, "planning_seconds", time.perf_counter() - t0)
    return plan


def plan_hash(header: tuple, rounds: Sequence[Round], copies: Sequence[LocalCopy]) -> str:
    """sha256 (hex) over a canonical byte form of the plan, identical across processes and runs.

    The byte form is ``marshal`` format version 0 of plain tuples of str/int/bool (stable across
    CPython versions; no interning or reference flags). Per round: every bucket as
    ``(src_side, sender, receiver, nbytes, k)`` where ``k`` numbers distinct item tuples in
    first-use order; an item tuple's items are hashed once, at first use.
    """
    h = hashlib.sha256()
    h.update(marshal.dumps(tuple(header), 0))
    index: dict[int, int] = {}  # id(items tuple) -> first-use number
    cols = [itemgetter(c) for c in (0, 1, 2, 4)]
    items_of = itemgetter(3)
    for r in rounds:
        bk = r.buckets
        ids = list(map(id, map(items_of, bk)))
        for i, items in dict(zip(ids, map(items_of, bk))).items():  # first use order
            if i not in index:
                index[i] = len(index)
                h.update(marshal.dumps(tuple(map(tuple, items)), 0))
        ks = list(map(index.__getitem__, ids))
        h.update(marshal.dumps((r.index, *(list(map(c, bk)) for c in cols), ks), 0))
    h.update(marshal.dumps(tuple(map(tuple, copies)), 0))
    return h.hexdigest()


__all__ = ["build_plan", "plan_hash", "index_sources", "group_instances", "receiver_needs", "make_items"]
