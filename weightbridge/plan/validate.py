"""``validate_plan``: an independent pass that reports every problem of a plan at once.

It trusts nothing the builder computed: every item is re-derived from the layouts. The one
planner module it shares is :mod:`weightbridge.plan.instances` (a pure function of the rollout
layout, not a builder result): instances with identical layouts answer identically, so each
bucket's checks are memoised per template slot.

Checks (``PlanProblem.kind``):

* ``unknown``   — a rank or local tensor named by a bucket or item does not exist.
* ``mapping``   — no piece of the named local tensor holds the item's canonical box at the
  item's local box (with the item's transpose flag).
* ``bounds``    — a local box outside its local tensor, or a canonical box outside the canonical
  tensor (when ``canonical`` is given).
* ``dtype``     — wire dtype differs from the receiver's local dtype (or, for a canonical tensor
  whose checkpoint dtype is a narrower float, from that one: ``layout.ir.checkpoint_cast``; from
  ``canonical`` when given, else from the rollout layout's ``casts``), or a float/integer/bool
  conversion between the two sides.
* ``bytes``     — an item's or bucket's byte count disagrees with its boxes.
* ``uncovered`` — elements a rollout rank needs that nobody sends it.
* ``duplicate`` — elements a rollout rank receives more than once (pieces overlap at the receiver).
* ``outside``   — elements a rollout rank receives but does not need.
* ``order``     — an exchange forwards elements the forwarding rank has not received earlier.
* ``round-cap`` — a rank's wire bytes (sent + received) in one round exceed ``round_bytes``.
"""

from __future__ import annotations

from weightbridge.gc_pause import gc_paused
from weightbridge.layout.box import Box, box_numel, contains, format_box, in_bounds, intersect
from weightbridge.layout.ir import CanonicalModel, LocalTensor, SideLayout, checkpoint_cast, dtype_bytes
from weightbridge.layout.quant import sender_sources
from weightbridge.plan.geometry import map_to_local, subtract_all
from weightbridge.plan.instances import group_instances, representatives
from weightbridge.plan.types import ROLLOUT, TRAINER, PlanProblem, TransferPlan, WireItem


def _kind(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    return "float"


class _Side:
    def __init__(self, layout: SideLayout, pieces: dict):
        self.ranks = {lay.rank: lay for lay in layout.ranks}
        self.casts = dict(layout.casts)
        self._tensors: dict[int, dict[str, LocalTensor]] = {}
        self.pieces = pieces  # id(tensor) -> (tensor, canonical name -> its pieces), shared by both sides

    def tensor(self, rank: int, name: str) -> LocalTensor | None:
        d = self._tensors.get(rank)
        if d is None:
            lay = self.ranks.get(rank)
            if lay is None:
                return None
            d = self._tensors[rank] = {t.name: t for t in lay.tensors}
        return d.get(name)


def _check_end(
    t: LocalTensor | None, what: str, name: str, cbox: Box, lbox: Box, transpose: bool, pieces: dict
) -> list[tuple[str, str]]:
    if t is None:
        return [("unknown", f"{what} tensor does not exist")]
    out = []
    if not in_bounds(lbox, t.shape):
        out.append(("bounds", f"{what} box {format_box(lbox)} outside {t.name} {list(t.shape)}"))
    idx = pieces.get(id(t))
    if idx is None or idx[0] is not t:
        by: dict[str, list] = {}
        for p in t.pieces:
            by.setdefault(p.canonical, []).append(p)
        idx = pieces[id(t)] = (t, by)
    for p in idx[1].get(name, ()):
        if p.transpose != transpose or not contains(p.canonical_box, cbox):
            continue
        m = map_to_local(cbox, p)
        if len(m) == 1 and m[0][1] == lbox:
            return out
    out.append(("mapping", f"no piece of {what} tensor {t.name} holds {name}{format_box(cbox)} at {format_box(lbox)}"))
    return out


def validate_plan(
    plan: TransferPlan, trainer: SideLayout, rollout: SideLayout, *, canonical: CanonicalModel | None = None
) -> list[PlanProblem]:
    """Every problem of ``plan`` for these layouts; empty when the plan is exact and within caps."""
    with gc_paused():  # many small acyclic objects next to a large heap
        return _validate(plan, trainer, rollout, canonical)


def _validate(
    plan: TransferPlan, trainer: SideLayout, rollout: SideLayout, canonical: CanonicalModel | None
) -> list[PlanProblem]:
    problems: list[PlanProblem] = []
    pieces: dict = {}
    trainer = sender_sources(trainer, rollout.quant)  # the sources the planner used (quantised weights: derived)
    sides = {TRAINER: _Side(trainer, pieces), ROLLOUT: _Side(rollout, pieces)}
    rsides = sides[ROLLOUT]
    # Instances with identical layouts answer identically: memoise per representative rank.
    rep = representatives(group_instances(rollout))
    memo: dict[tuple, list[tuple[str, str]]] = {}
    tot_memo: dict[int, int] = {}
    exchanges: list[tuple[int, int, int, WireItem]] = []
    cap = plan.round_bytes

    def add(kind: str, msg: str) -> None:
        problems.append(PlanProblem(kind, msg))

    received: dict[int, dict[str, list[Box]]] = {r: {} for r in rsides.ranks}
    for rnd in plan.rounds:
        loads: dict[tuple[str, int], int] = {}
        for b in rnd.buckets:
            src = sides.get(b.src_side)
            if src is None or b.sender not in src.ranks or b.receiver not in rsides.ranks:
                which = "receiver" if src is not None and b.sender in src.ranks else "sender"
                add("unknown", f"round {rnd.index} {b.src_side} {b.sender} -> rollout {b.receiver}: no such {which}")
                continue
            items = b.items
            srep = rep.get(b.sender, b.sender) if b.src_side == ROLLOUT else b.sender
            key = (id(items), b.src_side, srep, rep.get(b.receiver, b.receiver))
            res = memo.get(key)
            if res is None:
                res = memo[key] = _check_bucket(items, src, b.sender, rsides, b.receiver, canonical)
            if res:
                where = f"round {rnd.index} {b.src_side} {b.sender} -> rollout {b.receiver}"
                for kind, msg in res:
                    add(kind, f"{where}: {msg}")
            total = tot_memo.get(id(items))
            if total is None:
                total = tot_memo[id(items)] = sum(it.nbytes for it in items)
            if total != b.nbytes:
                add("bytes", f"round {rnd.index} {b.src_side} {b.sender} -> rollout {b.receiver}: "
                    f"bucket says {b.nbytes} bytes, items hold {total}")
            got = received[b.receiver]
            for it in items:
                lst = got.get(it.canonical)
                if lst is None:
                    got[it.canonical] = [it.canonical_box]
                else:
                    lst.append(it.canonical_box)
            if b.src_side == ROLLOUT:
                exchanges.extend((rnd.index, b.sender, b.receiver, it) for it in items)
            ks, kr = (b.src_side, b.sender), (ROLLOUT, b.receiver)
            loads[ks] = loads.get(ks, 0) + b.nbytes
            loads[kr] = loads.get(kr, 0) + b.nbytes
        for (side, rank), v in sorted(loads.items()):
            if v > cap:
                add("round-cap", f"round {rnd.index}: {side} {rank} moves {v} bytes > round_bytes {cap}")

    # coverage at every receiver
    for lay in rollout.ranks:
        need: dict[str, list[Box]] = {}
        for t in lay.tensors:
            for p in t.pieces:
                lst = need.get(p.canonical)
                if lst is None:
                    need[p.canonical] = [p.canonical_box]
                else:
                    lst.append(p.canonical_box)
        got = received[lay.rank]
        for name, boxes in need.items():
            g = got.pop(name, None)
            if g is not None and len(g) == 1 and len(boxes) == 1 and g[0] == boxes[0]:
                continue
            _cover(lay.rank, name, boxes, g or [], add)
        for name, g in sorted(got.items()):
            add("outside", f"rollout {lay.rank} receives {name} ({len(g)} boxes) but holds no piece of it")

    # exchanges forward only what arrived earlier
    if exchanges:
        arrived: dict[tuple[int, str], list[tuple[Box, int]]] = {}
        for rnd in plan.rounds:
            for b in rnd.buckets:
                if b.src_side == TRAINER:
                    for it in b.items:
                        arrived.setdefault((b.receiver, it.canonical), []).append((it.canonical_box, rnd.index))
        for rho, s, r, it in exchanges:
            have = 0
            for box, r0 in arrived.get((s, it.canonical), []):
                if r0 < rho:
                    ov = intersect(box, it.canonical_box)
                    if ov is not None:
                        have += box_numel(ov)
            if have < box_numel(it.canonical_box):
                add("order", f"round {rho} rollout {s} -> {r}: forwards {it.canonical}"
                    f"{format_box(it.canonical_box)} before receiving all of it")
    for c in plan.local_copies:
        st = rsides.tensor(c.rank, c.src_tensor)
        dt = rsides.tensor(c.rank, c.dst_tensor)
        for kind, msg in _check_end(st, "copy source", c.canonical, c.canonical_box, c.src_box, c.src_transpose,
                                    pieces) + \
                _check_end(dt, "copy target", c.canonical, c.canonical_box, c.dst_box, c.dst_transpose, pieces):
            add(kind, f"local copy on rollout {c.rank}: {c.canonical}{format_box(c.canonical_box)}: {msg}")
    return problems


def _check_bucket(items, src: _Side, sender: int, rsides: _Side, receiver: int,
                  canonical: CanonicalModel | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for it in items:
        st = src.tensor(sender, it.src_tensor)
        dt = rsides.tensor(receiver, it.dst_tensor)
        res = _check_end(st, "sender", it.canonical, it.canonical_box, it.src_box, it.src_transpose, src.pieces)
        res += _check_end(dt, "receiver", it.canonical, it.canonical_box, it.dst_box, it.dst_transpose, rsides.pieces)
        if dt is not None:
            ckpt = (canonical[it.canonical].dtype if canonical is not None and it.canonical in canonical
                    else rsides.casts.get(it.canonical))
            want_dtype = (ckpt and checkpoint_cast(dt.dtype, ckpt)) or dt.dtype
            if it.dtype != want_dtype:
                why = "the receiver's" if want_dtype == dt.dtype else f"the checkpoint's (receiver: {dt.dtype})"
                res.append(("dtype", f"wire dtype {it.dtype} is not {why} {want_dtype}"))
        if st is not None and dt is not None and _kind(st.dtype) != _kind(dt.dtype):
            res.append(("dtype", f"{st.dtype} on the sender vs {dt.dtype} on the receiver"))
        try:
            want = box_numel(it.canonical_box) * dtype_bytes(it.dtype)
        except KeyError:
            res.append(("dtype", f"unknown dtype {it.dtype}"))
            want = it.nbytes
        if it.nbytes != want:
            res.append(("bytes", f"item says {it.nbytes} bytes, its box holds {want}"))
        if canonical is not None:
            if it.canonical not in canonical:
                res.append(("unknown", f"canonical tensor {it.canonical} not in the model"))
            elif not in_bounds(it.canonical_box, canonical[it.canonical].shape):
                res.append(("bounds", f"canonical box {format_box(it.canonical_box)} outside "
                            f"{list(canonical[it.canonical].shape)}"))
        where = f"{it.canonical}{format_box(it.canonical_box)}: "
        out.extend((kind, where + msg) for kind, msg in res)
    return out


def _cover(rank: int, name: str, need: list[Box], got: list[Box], add) -> None:
    if len(need) == 1 and len(got) == 1 and got[0] == need[0]:
        return
    if len(need) == 1:
        need_numel = box_numel(need[0])
    else:
        seen: list[Box] = []
        need_numel = 0
        for b in need:
            need_numel += sum(box_numel(x) for x in subtract_all(b, seen))
            seen.append(b)
    got_numel = sum(box_numel(b) for b in got)
    dup = _overlaps(got)
    if dup is not None:
        a, b = dup
        add("duplicate", f"rollout {rank} receives {name}{format_box(intersect(a, b))} more than once")
    if len(need) == 1:
        outside = [b for b in got if not contains(need[0], b)]
    else:
        outside = [b for b in got if not any(contains(n, b) for n in need)]
    for b in outside[:3]:
        add("outside", f"rollout {rank} receives {name}{format_box(b)} it does not need")
    if dup is None and not outside and got_numel < need_numel:
        missing = need_numel - got_numel
        add("uncovered", f"rollout {rank} needs {missing} elements of {name} that nobody sends "
            f"(needs {need_numel}, receives {got_numel})")


def _overlaps(boxes: list[Box]) -> tuple[Box, Box] | None:
    """One overlapping pair among ``boxes`` (sweep on dim 0), or None."""
    if len(boxes) < 2:
        return None
    if not boxes[0]:
        return (boxes[0], boxes[1])
    order = sorted(boxes)
    active: list[Box] = []
    for b in order:
        start = b[0][0]
        active = [a for a in active if a[0][1] > start]
        for a in active:
            if intersect(a, b) is not None:
                return (a, b)
        active.append(b)
    return None
