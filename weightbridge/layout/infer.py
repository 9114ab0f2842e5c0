"""Spec rules from probed layouts: the rule vocabulary read backwards. Pure (no torch).

Given the probed :class:`~weightbridge.layout.ir.RankLayout` of every rank along one mesh axis
(an engine's TP ranks, in rank order) and the canonical model, :func:`infer_rules` writes, for
each local tensor, the rule that gives the same boxes:

* its pieces are grouped into parts (runs of pieces of one canonical tensor whose canonical and
  local boxes are each one box: a permuted block's per-row pieces), laid out along one local dim
  (a ``concat`` when there are several parts);
* per part, the canonical boxes of the ranks give the ``slice`` (the window the ranks share out)
  and the ``shard`` step (equal consecutive chunks over the axis; blocks replicated on
  consecutive ranks, vLLM's KV heads, give ``blocks`` + ``replicate``); the local block's shape
  against the canonical box's gives ``transpose`` or ``permute``;
* a tensor only the first rank fills (a row-parallel bias added once) is padded to the axis size
  times its rows and sharded: the other ranks hold padding of the same shape;
* a tensor whose dim 0 stacks experts (every piece of one slot from one ``experts.N.`` tensor)
  gets one body for all slots with ``{expert}``, and ``stack`` (dealt over the axis when the
  ranks hold different experts);
* layer indices become ``{layer}`` (one rule per tensor template, from its first layer).

What this vocabulary cannot say (uneven chunks, vocabulary padding, a view of different dims) is
reported per tensor, not guessed: the presets carry those. Every rule it writes must still be checked by expanding it and diffing against the
probes (:func:`weightbridge.ops.rules_from_probe.rules_from_probes` does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from weightbridge.layout.box import Box, box_shape
from weightbridge.layout.ir import CanonicalModel, LocalTensor, Piece, RankLayout
from weightbridge.layout.local_build import RuleProblem, permuted_pieces
from weightbridge.layout.normalize import normalize_pieces

_LAYER = re.compile(r"(?<=\.layers\.)(\d+)(?=\.)")
MAX_PERMUTE_DIMS = 6
MAX_PIECES = 4096  # per local tensor: a probe file is input, and each candidate permutation is tried on them


@dataclass(frozen=True)
class Inferred:
    """Rules (spec YAML data, one per local tensor template) and the tensors no rule could say."""

    rules: tuple[dict[str, Any], ...]
    unexplained: tuple[tuple[str, str], ...]  # (local tensor, why)


class _Cannot(Exception):
    pass


def _template(name: str) -> tuple[str, str | None]:
    """``name`` with its layer index as ``{layer}``, and that index (None: no layer)."""
    m = _LAYER.search(name)
    return (name, None) if m is None else (name[: m.start()] + "{layer}" + name[m.end():], m.group(1))


def _bounding(boxes: Sequence[Box]) -> Box:
    return tuple((min(b[d][0] for b in boxes), max(b[d][1] for b in boxes)) for d in range(len(boxes[0])))


def _numel(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def _parts(t: LocalTensor) -> list[tuple[str, Box, Box, list[Piece]]]:
    """Runs of pieces of one canonical tensor whose canonical and local boxes each form one box:
    ``(canonical, canonical box, local box, pieces)``, in local order."""
    pieces = sorted(normalize_pieces(t.pieces), key=lambda p: p.local_box)
    out: list[tuple[str, Box, Box, list[Piece]]] = []
    for p in pieces:
        if out and out[-1][0] == p.canonical:
            name, _, _, run = out[-1]
            grown = [*run, p]
            cb, lb = _bounding([q.canonical_box for q in grown]), _bounding([q.local_box for q in grown])
            total = sum(_numel(q.local_box) for q in grown)
            if _numel(cb) == total and _numel(lb) == total:
                out[-1] = (name, cb, lb, grown)
                continue
        out.append((p.canonical, p.canonical_box, p.local_box, [p]))
    return out


def _layout_op(cname: str, cbox: Box, lbox: Box, pieces: list[Piece]) -> dict[str, Any]:
    """``transpose`` / ``permute`` (or nothing) whose pieces are exactly ``pieces``: the canonical
    block ``cbox`` stored at ``lbox``. Every permutation that fits the shapes is tried (equal dims
    make several fit) and its pieces compared with the actual ones."""
    cshape, lshape = box_shape(cbox), box_shape(lbox)
    origin = [a for a, _ in lbox]
    actual = normalize_pieces(
        Piece(p.canonical, p.canonical_box, tuple((a - o, b - o) for (a, b), o in zip(p.local_box, origin)), p.transpose)
        for p in pieces)
    if len(cshape) != len(lshape):
        raise _Cannot(f"a {list(cshape)} block held as {list(lshape)} (a view of other dims)")
    if len(cshape) > MAX_PERMUTE_DIMS:
        raise _Cannot(f"a {len(cshape)}-dim block")
    for perm in permutations(range(len(cshape))):
        if tuple(cshape[d] for d in perm) != lshape:
            continue
        try:
            want = permuted_pieces(cname, cbox, perm, cname)
        except RuleProblem as exc:
            raise _Cannot(exc.message) from None
        if normalize_pieces(want) != actual:
            continue
        if perm == tuple(range(len(cshape))):
            return {}
        return {"transpose": True} if perm == (1, 0) else {"permute": list(perm)}
    raise _Cannot(f"a {list(cshape)} block held as {list(lshape)} in no permutation's order")


def _windows(boxes: list[Box], full: tuple[int, ...], axis: str) -> dict[str, Any]:
    """``slice`` and ``shard`` giving canonical box ``boxes[r]`` to rank ``r`` of ``len(boxes)``."""
    size = len(boxes)
    moving = [d for d in range(len(full)) if len({b[d] for b in boxes}) > 1]
    if len(moving) > 1:
        raise _Cannot(f"ranks differ along canonical dims {moving} (one shard step per part is inferred)")
    out: dict[str, Any] = {}
    slices = []
    shard_dim = moving[0] if moving else None
    for d in range(len(full)):
        if d == shard_dim:
            starts = [b[d][0] for b in boxes]
            widths = {b[d][1] - b[d][0] for b in boxes}
            if len(widths) != 1:
                raise _Cannot(f"uneven chunks of canonical dim {d} over {axis}")
            w = widths.pop()
            distinct = sorted(set(starts))
            blocks = len(distinct)
            if distinct != [starts[0] + k * w for k in range(blocks)] or size % blocks:
                raise _Cannot(f"canonical dim {d} is not dealt in order over {axis}")
            rep = size // blocks
            if starts != [starts[0] + (r // rep) * w for r in range(size)]:
                raise _Cannot(f"canonical dim {d} is not dealt in order over {axis}")
            lo, hi = starts[0], starts[0] + blocks * w
            step: dict[str, Any] = {"dim": d, "axis": axis}
            if rep > 1:
                step.update(blocks=blocks, replicate=True)
            out["shard"] = [step]
        else:
            lo, hi = boxes[0][d]
        if (lo, hi) != (0, full[d]):
            slices.append({"dim": d, "start": lo, "stop": hi})
    if slices:
        out["slice"] = slices
    return out


def _rule(name: str, per_rank: list[LocalTensor], model: CanonicalModel, axis: str) -> dict[str, Any]:
    if any(len(t.pieces) > MAX_PIECES for t in per_rank):
        raise _Cannot(f"more than {MAX_PIECES:,} pieces")
    unknown = sorted({p.canonical for t in per_rank for p in t.pieces if p.canonical not in model})
    if unknown:
        raise _Cannot(f"canonical tensor(s) the model does not have: {', '.join(unknown[:3])}")
    shapes = {t.shape for t in per_rank}
    if len(shapes) != 1:
        raise _Cannot(f"shapes differ between ranks: {sorted(shapes)}")
    runs = [_parts(t) for t in per_rank]
    if len({len(r) for r in runs}) != 1 or not runs[0]:
        raise _Cannot("ranks hold different numbers of parts" if runs[0] else "holds no canonical element")
    parts: list[dict[str, Any]] = []
    locals_: list[Box] = []
    for k in range(len(runs[0])):
        names = {r[k][0] for r in runs}
        lboxes = {r[k][2] for r in runs}
        if len(names) != 1 or len(lboxes) != 1:
            raise _Cannot(f"part {k} differs between ranks (canonical {sorted(names)}, local boxes {sorted(lboxes)})")
        cname, lbox = names.pop(), lboxes.pop()
        cboxes = [r[k][1] for r in runs]
        part: dict[str, Any] = {"canonical": cname, **_windows(cboxes, model[cname].shape, axis)}
        part.update(_layout_op(cname, cboxes[0], lbox, runs[0][k][3]))
        parts.append(part)
        locals_.append(lbox)
    dtype = per_rank[0].dtype
    rule: dict[str, Any] = {"local": name}
    if len(parts) == 1:
        if locals_[0] != tuple((0, n) for n in per_rank[0].shape):
            raise _Cannot("one part that does not fill the tensor (padding)")
        rule.update(parts[0])
    else:
        dims = {d for lb in locals_ for d, (a, b) in enumerate(lb) if (a, b) != (0, per_rank[0].shape[d])}
        ends = [lb[min(dims)] for lb in locals_] if len(dims) == 1 else []
        if len(dims) != 1 or ends[0][0] != 0 or any(x[1] != y[0] for x, y in zip(ends, ends[1:])) \
                or ends[-1][1] != per_rank[0].shape[min(dims)]:
            raise _Cannot("parts do not tile one local dim in order (not a concat)")
        rule["concat"] = {"dim": min(dims), "parts": parts}
    if any(model[p["canonical"]].dtype != dtype for p in parts):
        rule["dtype"] = dtype
    return rule


_EXPERT = re.compile(r"(?<=\.experts\.)(\d+)(?=\.)")


def _expert_of(p: Piece) -> int | None:
    m = _EXPERT.search(p.canonical)
    return int(m.group(1)) if m else None


def _stacked_rule(name: str, per_rank: list[LocalTensor], model: CanonicalModel, axis: str) -> dict[str, Any] | None:
    """The rule of a tensor whose dim 0 stacks experts (``w13_weight`` of per-expert checkpoint
    tensors): one body for every expert slot, ``{expert}`` in its canonical names, dealt over
    ``axis`` when the ranks hold different experts. None when the tensor is not such a stack."""
    if any(len(t.shape) < 2 for t in per_rank) or not all(t.pieces for t in per_rank):
        return None
    if not all(_expert_of(p) is not None and p.local_box[0][1] - p.local_box[0][0] == 1 for t in per_rank for p in t.pieces):
        return None
    slots: list[dict[int, list[Piece]]] = []
    firsts = []
    for t in per_rank:
        by_slot: dict[int, list[Piece]] = {}
        for p in t.pieces:
            by_slot.setdefault(p.local_box[0][0], []).append(p)
        experts = []
        for i in range(t.shape[0]):
            es = {_expert_of(p) for p in by_slot.get(i, [])}
            if len(es) != 1:
                raise _Cannot(f"stacked slot {i} holds experts {sorted(e for e in es if e is not None)}")
            experts.append(es.pop())
        if experts != list(range(experts[0], experts[0] + len(experts))):
            raise _Cannot(f"stacked experts {experts} are not consecutive")
        slots.append(by_slot)
        firsts.append(experts[0])
    ref = firsts[0]

    def item(t: LocalTensor, pieces: list[Piece], expert: int) -> LocalTensor:
        """Slot ``pieces`` of expert ``expert`` as an unstacked tensor, named as expert ``ref``'s."""
        pat = re.compile(rf"(?<=\.experts\.){expert}(?=\.)")
        moved = tuple(Piece(pat.sub(str(ref), p.canonical, count=1), p.canonical_box, p.local_box[1:], p.transpose)
                      for p in pieces)
        return LocalTensor(t.name, t.shape[1:], t.dtype, moved)

    body = None
    for i in range(per_rank[0].shape[0]):
        rule = _rule(name, [item(t, slots[r][i], firsts[r] + i) for r, t in enumerate(per_rank)], model, axis)
        if body is not None and rule != body:
            raise _Cannot(f"stacked slot {i} is laid out unlike slot 0")
        body = rule
    assert body is not None
    out = _renamed(body, re.compile(rf"(?<=\.experts\.){ref}(?=\.)"), "{expert}")
    count = firsts[-1] + per_rank[-1].shape[0] if len(set(firsts)) > 1 else per_rank[0].shape[0]
    out["stack"] = {"count": count, **({"axis": axis} if len(set(firsts)) > 1 else {})}
    return out


def _first_rank_only(name: str, holders: list[RankLayout], ranks: Sequence[RankLayout], model: CanonicalModel,
                     axis: str) -> dict[str, Any]:
    """A tensor only the first rank fills, whole (a row-parallel bias added once: vLLM's gpt-oss
    ``w2_bias``; the other ranks' copy stays zero): dim 0 padded to ``axis`` times its size and
    sharded over ``axis``, so rank 0 holds the data and every other rank padding of the same shape."""
    if [r.rank for r in holders] != [ranks[0].rank]:
        raise _Cannot("held by some ranks only, and not just by the first")
    t = ranks[0].tensor(name)
    rule = _rule(name, [t], model, axis)
    if "canonical" not in rule or any(k in rule for k in ("slice", "shard", "pad", "permute", "transpose")):
        raise _Cannot("held by the first rank only, not as one whole canonical tensor")
    n = model[rule["canonical"]].shape[0]
    return {**rule, "pad": {"dim": 0, "multiple": f"{axis} * {n}"}, "shard": [{"dim": 0, "axis": axis}]}


def _templated(rule: dict[str, Any], layer: str | None) -> dict[str, Any]:
    """``rule`` with ``.layers.<layer>.`` written ``.layers.{layer}.`` in every name."""
    if layer is None:
        return rule
    return _renamed(rule, re.compile(rf"(?<=\.layers\.){layer}(?=\.)"), "{layer}")


def _renamed(value: Any, pattern: re.Pattern[str], template: str) -> Any:
    """``value`` (rule data) with ``pattern`` replaced by ``template`` in every string."""
    if isinstance(value, str):
        return pattern.sub(template, value)
    if isinstance(value, list):
        return [_renamed(v, pattern, template) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, pattern, template) for k, v in value.items()}
    return value


def infer_rules(model: CanonicalModel, ranks: Sequence[RankLayout], *, axis: str = "tp",
                names: Sequence[str] | None = None) -> Inferred:
    """One rule per local tensor template of ``ranks`` (every rank along ``axis``, in order; a
    single rank: nothing is sharded), or only for the local tensors ``names``."""
    if not ranks:
        return Inferred((), ())
    wanted = None if names is None else set(names)
    by_template: dict[str, tuple[str, str | None]] = {}
    for t in ranks[0].tensors:
        if wanted is not None and t.name not in wanted:
            continue
        tmpl, layer = _template(t.name)
        if tmpl not in by_template or (layer is not None and int(layer) < int(by_template[tmpl][1] or 0)):
            by_template[tmpl] = (t.name, layer)
    rules, unexplained = [], []
    for tmpl in sorted(by_template):
        name, layer = by_template[tmpl]
        held = [t for r in ranks for t in r.tensors if t.name == name and t.pieces]
        if len(held) != len(ranks):
            try:
                rule = _first_rank_only(name, [r for r in ranks if any(t.name == name for t in r.tensors)], ranks,
                                        model, axis)
            except _Cannot as exc:
                unexplained.append((name, str(exc)))
                continue
            rules.append(_templated(rule, layer))
            continue
        per_rank = held
        try:
            rule = _stacked_rule(name, per_rank, model, axis) or _rule(name, per_rank, model, axis)
        except _Cannot as exc:
            unexplained.append((name, str(exc)))
            continue
        rules.append(_templated(rule, layer))
    return Inferred(tuple(rules), tuple(unexplained))
