"""Quantised rollout targets in canonical coordinates: FP8 E4M3 weights with block scales (pure).

Frames and names:

* A **quantised weight** ``W`` is a canonical tensor (2-D ``[N, K]``) that the rollout serves as
  FP8 E4M3 values plus a **scale tensor** ``S = W + scheme.suffix`` (``q_proj.weight`` ->
  ``q_proj.weight_scale_inv``), a canonical tensor of its own, derived from ``W``:
  ``[ceil(N / bn), ceil(K / bk)]`` for ``(bn, bk)`` blocks, ``[N, 1]`` per row. Block ``(i, j)`` is
  ``W[i*bn:(i+1)*bn, j*bk:(j+1)*bk]`` (cut at the tensor's end); scale ``(i, j)`` and the FP8 values
  of the block are functions of that block alone (:mod:`weightbridge.quant` computes them exactly
  as vLLM does). ``W``'s canonical dtype is the one it is quantised *from* (bf16): what the trainer
  holds and an unquantised checkpoint stores.
* **Rollout** (:func:`quantize_rollout`): a local tensor made of quantised weights becomes FP8 and
  gets a scale local tensor ``name + suffix`` (vLLM's ``qkv_proj.weight_scale_inv``,
  ``w13_weight_scale_inv``) whose pieces are its pieces divided by the block. The engine quantises
  its local tensor block by block, so local blocks must be canonical blocks: every piece starts on
  a block edge in both frames and ends on one, or at the end of both.
* **Trainer** (:func:`sender_sources`): a trainer rank holding whole blocks of ``W`` (in any
  number of pieces and local tensors) derives their FP8 values and scales. For the planner it
  holds two virtual tensors, ``wb:quant:W`` (FP8, ``W``'s shape) and ``wb:quant:S`` (scales),
  whose pieces are those blocks; its own (bf16, fp32) pieces of ``W`` are no source of ``W``
  (a plain cast is not a quantisation). A block that no rank holds whole cannot be quantised at the
  sender: :func:`unheld_blocks` finds them (the spec check refuses them).

Why blocks and not items: a block's scale depends on all its elements, so the sender that sends
any element of a block must hold the whole block; items themselves may then be cut anywhere.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from weightbridge.layout.box import Box, box_numel
from weightbridge.layout.coverage import union_numel
from weightbridge.layout.ir import (
    CanonicalModel,
    CanonicalTensor,
    LocalTensor,
    Piece,
    QuantizedWeight,
    QuantScheme,
    RankLayout,
    SideLayout,
)

VIRTUAL = "wb:quant:"  # prefix of the trainer's derived tensors (never a module path: it has a colon)
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def scale_name(weight: str, scheme: QuantScheme) -> str:
    return weight + scheme.suffix


def scale_shape(shape: Sequence[int], scheme: QuantScheme) -> tuple[int, int]:
    """The scale grid of a 2-D ``shape``."""
    n, k = shape[-2], shape[-1]
    if scheme.kind == "row":
        return (n, 1)
    bn, bk = scheme.block
    return (-(-n // bn), -(-k // bk))


def scale_box(box: Box, scheme: QuantScheme) -> Box:
    """The scales of the blocks a 2-D ``box`` (of a weight) touches."""
    (a, z), (c, d) = box[-2], box[-1]
    if scheme.kind == "row":
        return ((a, z), (0, 1))
    bn, bk = scheme.block
    return ((a // bn, -(-z // bn)), (c // bk, -(-d // bk)))


def weight_box(sbox: Box, shape: Sequence[int], scheme: QuantScheme) -> Box:
    """The weight elements (clipped to ``shape``) whose blocks are the scales ``sbox``."""
    (a, z), (c, d) = sbox
    n, k = shape[-2], shape[-1]
    if scheme.kind == "row":
        return ((a, z), (0, k))
    bn, bk = scheme.block
    return ((a * bn, min(z * bn, n)), (c * bk, min(d * bk, k)))


# ---- which weights ----------------------------------------------------------------------------

# What engines quantise by default: the linear layers of the decoder blocks, not routers (vLLM
# builds them unquantised), embeddings, norms or biases.
DEFAULT_WEIGHTS = ("*.layers.*.weight",)
DEFAULT_EXCLUDE = ("*.mlp.gate.weight", "*norm*", "*.embed_tokens.*", "lm_head.*")


def select_weights(model: CanonicalModel, include: Sequence[str] | None = None,
                   exclude: Sequence[str] = ()) -> list[str]:
    """Canonical 2-D floating ``*.weight`` tensors matching ``include`` (default
    :data:`DEFAULT_WEIGHTS` minus :data:`DEFAULT_EXCLUDE`) and no ``exclude`` glob, sorted."""
    inc = tuple(include) if include is not None else DEFAULT_WEIGHTS
    exc = tuple(exclude) + (DEFAULT_EXCLUDE if include is None else ())
    out = []
    for t in model.tensors:
        if len(t.shape) != 2 or not t.dtype.startswith(("float", "bfloat")) or t.dtype.startswith("float8"):
            continue
        if any(fnmatch.fnmatchcase(t.name, p) for p in inc) and not any(fnmatch.fnmatchcase(t.name, p) for p in exc):
            out.append(t.name)
    return sorted(out)


def quantize_model(model: CanonicalModel, weights: Iterable[str], scheme: QuantScheme) -> CanonicalModel:
    """Unquantised ``model`` with ``weights`` stored quantised: each one's scale tensor right after
    it, ``quant`` set. Raises ``ValueError`` when a scale tensor's name is already a tensor of ``model``."""
    if model.quant:
        raise ValueError("quantize_model takes an unquantised model (see unquantized())")
    added: dict[str, QuantizedWeight] = {}
    for w in weights:
        s = scale_name(w, scheme)
        if s in model:
            raise ValueError(f"{s} is already a tensor of the model: {w} cannot get a scale tensor of that name")
        added[w] = QuantizedWeight(w, s, tuple(model[w].shape), scheme)
    tensors: list[CanonicalTensor] = []
    for t in model.tensors:
        tensors.append(t)
        q = added.get(t.name)
        if q is not None:
            tensors.append(CanonicalTensor(q.scale, scale_shape(q.shape, scheme), scheme.scale_dtype))
    return CanonicalModel(tensors=tuple(tensors), params=model.params, source=model.source,
                          quant=tuple(sorted(added.values())))


def unquantized(model: CanonicalModel) -> CanonicalModel:
    """``model`` without scale tensors (what rules expand against: scales are derived, never laid out)."""
    if not model.quant:
        return model
    scales = {q.scale for q in model.quant}
    return CanonicalModel(tensors=tuple(t for t in model.tensors if t.name not in scales), params=model.params,
                          source=model.source)


def stored(model: CanonicalModel) -> CanonicalModel:
    """``model`` as its checkpoint stores it: each quantised weight in its FP8 dtype (what an engine
    loading that checkpoint is fed)."""
    if not model.quant:
        return model
    fp8 = {q.weight: q.scheme.dtype for q in model.quant}
    return replace(model, tensors=tuple(t._replace(dtype=fp8[t.name]) if t.name in fp8 else t for t in model.tensors))


# ---- the rollout side ------------------------------------------------------------------------


def quantize_rollout(side: SideLayout, model: CanonicalModel) -> tuple[SideLayout, list[str]]:
    """The rollout layout receiving ``model.quant``'s weights quantised, and its problems.

    Each local tensor holding quantised weights becomes ``scheme.dtype`` and gets its scale local
    tensor; ``side.quant`` records each weight with the dtypes its values pass through (the
    canonical one, then the local one the engine quantises from). Problems (each naming the rank):
    a local tensor mixing quantised and other tensors, transposed or reshaped pieces, pieces off
    the block grid in either frame.
    """
    table = {q.weight: q for q in model.quant}
    problems: list[str] = []
    source: dict[str, set[str]] = {}
    done: dict[int, tuple[LocalTensor, ...]] = {}
    ranks = []
    for r in side.ranks:
        key = id(r.tensors)
        if key not in done:
            done[key] = _quantize_tensors(r, table, model, source, problems)
        ranks.append(r if done[key] is r.tensors else replace(r, tensors=done[key]))
    quant = []
    for w in sorted(source):
        dts = sorted(source[w])
        if len(dts) > 1:
            problems.append(f"{w} is held as {' and '.join(dts)}: one dtype to quantise from")
        q = table[w]
        quant.append(q._replace(source=tuple(dict.fromkeys((model[w].dtype, dts[0])))))
    return SideLayout(side.side, tuple(ranks), side.num_instances, quant=tuple(quant)), problems


def _quantize_tensors(r: RankLayout, table: Mapping[str, QuantizedWeight], model: CanonicalModel,
                      source: dict[str, set[str]], problems: list[str]) -> tuple[LocalTensor, ...]:
    out: list[LocalTensor] = []
    names = {t.name for t in r.tensors}
    changed = False
    for t in r.tensors:
        quantised = [p for p in t.pieces if p.canonical in table]
        if not quantised:
            out.append(t)
            continue
        changed = True
        where = f"rollout rank {r.rank}: {t.name}"
        if len(quantised) != len(t.pieces):
            other = next(p.canonical for p in t.pieces if p.canonical not in table)
            problems.append(f"{where} holds quantised {quantised[0].canonical} and unquantised {other}: "
                            "the engine quantises a local tensor whole")
            out.append(t)
            continue
        schemes = {table[p.canonical].scheme for p in quantised}
        scheme = next(iter(schemes))
        bad = [f"{len(schemes)} different schemes"] if len(schemes) > 1 else []
        if len(t.shape) < 2:
            bad.append(f"it is {len(t.shape)}-D")
        pieces: list[Piece] = []
        for p in t.pieces if not bad else ():
            why = _piece_problem(p, t.shape, model[p.canonical].shape, scheme)
            if why:
                bad.append(f"{p.canonical}{list(p.canonical_box)}: {why}")
                continue
            lead = p.local_box[:-2]
            pieces.append(Piece(scale_name(p.canonical, scheme), scale_box(p.canonical_box, scheme),
                                lead + scale_box(p.local_box, scheme)))
            source.setdefault(p.canonical, set()).add(t.dtype)
        sname = t.name + scheme.suffix
        if sname in names:
            bad.append(f"its scale tensor's name {sname} is taken")
        if bad:
            problems.append(f"{where}: cannot hold quantised weights ({'; '.join(bad[:3])})")
            out.append(t)
            continue
        out.append(LocalTensor(t.name, t.shape, scheme.dtype, t.pieces))
        out.append(LocalTensor(sname, tuple(t.shape[:-2]) + scale_shape(t.shape, scheme), scheme.scale_dtype,
                               tuple(pieces)))
    return tuple(out) if changed else r.tensors


def _piece_problem(p: Piece, local_shape: Sequence[int], canonical_shape: Sequence[int],
                   scheme: QuantScheme) -> str | None:
    """Why piece ``p`` of a local tensor cannot hold FP8 blocks the engine makes the same way, or None."""
    if p.transpose:
        return "transposed"
    if len(canonical_shape) != 2:
        return f"a {len(canonical_shape)}-D weight"
    lead, tail = p.local_box[:-2], p.local_box[-2:]
    if any(z - a != 1 for a, z in lead) or [z - a for a, z in tail] != [z - a for a, z in p.canonical_box]:
        return "not a 2-D box of the local tensor's last two dims"
    if scheme.kind == "row":
        return None
    for d, b in enumerate(scheme.block):
        (ca, cz), (la, lz) = p.canonical_box[d], tail[d]
        cdim, ldim = canonical_shape[d], local_shape[len(local_shape) - 2 + d]
        if ca % b or la % b or ((cz - ca) % b and not (cz == cdim and lz == ldim)):
            return (f"dim {d} [{ca}, {cz}) at local [{la}, {lz}) is off the {b}-element block grid "
                    "(the engine's blocks would mix it with other elements)")
    return None


# ---- the trainer side: derived sources -----------------------------------------------------------


def sender_sources(trainer: SideLayout, quant: Sequence[QuantizedWeight]) -> SideLayout:
    """``trainer`` as the planner sees it when the rollout receives ``quant`` quantised: each rank's
    pieces of a quantised weight replaced by the virtual FP8 and scale tensors of the whole blocks
    it holds (:func:`held_blocks`). Ranks sharing a tensor tuple share the result."""
    if not quant:
        return trainer
    table = {q.weight: q for q in quant}
    done: dict[int, tuple[LocalTensor, ...]] = {}
    ranks = []
    for r in trainer.ranks:
        key = id(r.tensors)
        if key not in done:
            done[key] = _sources(r.tensors, table)
        ranks.append(replace(r, tensors=done[key]))
    return SideLayout(trainer.side, tuple(ranks), trainer.num_instances, quant=trainer.quant)


def _sources(tensors: tuple[LocalTensor, ...], table: Mapping[str, QuantizedWeight]) -> tuple[LocalTensor, ...]:
    boxes: dict[str, list[Box]] = {}
    out: list[LocalTensor] = []
    for t in tensors:
        kept = tuple(p for p in t.pieces if p.canonical not in table)
        for p in t.pieces:
            if p.canonical in table:
                boxes.setdefault(p.canonical, []).append(p.canonical_box)
        out.append(t if len(kept) == len(t.pieces) else t._replace(pieces=kept))
    for w in sorted(boxes):
        q = table[w]
        held = held_blocks(boxes[w], q.shape, q.scheme)
        if not held:
            continue
        out.append(LocalTensor(VIRTUAL + w, q.shape, q.scheme.dtype, tuple(Piece(w, b, b) for b in held)))
        sboxes = tuple(scale_box(b, q.scheme) for b in held)
        out.append(LocalTensor(VIRTUAL + q.scale, scale_shape(q.shape, q.scheme), q.scheme.scale_dtype,
                               tuple(Piece(q.scale, b, b) for b in sboxes)))
    return tuple(out)


def held_blocks(boxes: Sequence[Box], shape: Sequence[int], scheme: QuantScheme) -> list[Box]:
    """The whole blocks of a weight of ``shape`` inside the union of ``boxes`` (canonical frame), as
    disjoint block-aligned boxes (clipped to ``shape``) in row-major order."""
    n, k = shape
    bn, bk = (1, k) if scheme.kind == "row" else scheme.block
    if n == 0 or k == 0:
        return []
    if len(boxes) == 1:  # the usual case (a shard): one aligned sub-box
        (a, z), (c, d) = boxes[0]
        i0, i1 = -(-a // bn), (z // bn if z < n else -(-n // bn))
        j0, j1 = -(-c // bk), (d // bk if d < k else -(-k // bk))
        return [((i0 * bn, min(i1 * bn, n)), (j0 * bk, min(j1 * bk, k)))] if i1 > i0 and j1 > j0 else []
    rows = sorted({x for b in boxes for x in b[0]} | {0, n})
    bands = [(lo, hi, _union([b[1] for b in boxes if b[0][0] <= lo and hi <= b[0][1]]))
             for lo, hi in zip(rows, rows[1:]) if hi > lo]
    per_row: list[tuple[tuple[int, int], ...]] = []
    nblk = -(-k // bk)
    for i in range(-(-n // bn)):
        r0, r1 = i * bn, min((i + 1) * bn, n)
        cols: list[tuple[int, int]] = [(0, k)]
        for lo, hi, ivs in bands:
            if hi > r0 and lo < r1:
                cols = _intersect_intervals(cols, ivs)
        runs = []
        for a, z in cols:
            j0, j1 = -(-a // bk), (z // bk if z < k else nblk)
            if j1 > j0:
                runs.append((j0, j1))
        per_row.append(tuple(runs))
    out: list[Box] = []
    i = 0
    while i < len(per_row):
        j = i
        while j + 1 < len(per_row) and per_row[j + 1] == per_row[i]:
            j += 1
        for j0, j1 in per_row[i]:
            out.append(((i * bn, min((j + 1) * bn, n)), (j0 * bk, min(j1 * bk, k))))
        i = j + 1
    return out


def _union(ivs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, z in sorted(ivs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], z))
        elif z > a:
            out.append((a, z))
    return out


def _intersect_intervals(xs: Sequence[tuple[int, int]], ys: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, z in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(z, d)
            if hi > lo:
                out.append((lo, hi))
    return out


def unheld_blocks(sources: SideLayout, quant: Sequence[QuantizedWeight]) -> dict[str, int]:
    """Quantised weight -> how many of its elements lie in blocks no trainer rank holds whole
    (``sources``: :func:`sender_sources`' result); only weights with such blocks."""
    boxes: dict[str, set[Box]] = {}
    seen: set[int] = set()
    for r in sources.ranks:
        if id(r.tensors) in seen:
            continue
        seen.add(id(r.tensors))
        for t in r.tensors:
            if t.name.startswith(VIRTUAL):
                for p in t.pieces:
                    boxes.setdefault(p.canonical, set()).add(p.canonical_box)
    out = {}
    for q in quant:
        missing = box_numel(tuple((0, d) for d in q.shape)) - union_numel(boxes.get(q.weight, ()))
        if missing:
            out[q.weight] = missing
    return out


__all__ = [
    "DEFAULT_EXCLUDE", "DEFAULT_WEIGHTS", "FP8_MAX", "VIRTUAL", "held_blocks", "quantize_model", "quantize_rollout",
    "scale_box", "scale_name", "scale_shape", "select_weights", "sender_sources", "stored", "unheld_blocks", "unquantized",
    "weight_box",
]
