"""Small builders of SideLayouts for planner tests (no spec files)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from weightbridge.layout.box import box_numel, full_box
from weightbridge.layout.ir import LocalTensor, Piece, RankLayout, SideLayout


def shard_box(shape: Sequence[int], dim: int | None, k: int, i: int) -> tuple[tuple[int, int], ...]:
    """Box of the i-th of k near-equal shards of ``shape`` along ``dim`` (None: the whole tensor)."""
    if dim is None or k == 1:
        return full_box(shape)
    n = shape[dim]
    a, b = n * i // k, n * (i + 1) // k
    return tuple((a, b) if d == dim else (0, s) for d, s in enumerate(shape))


def local(
    name: str, cbox, dtype: str = "bfloat16", local_name: str | None = None, transpose: bool = False
) -> LocalTensor:
    """A local tensor holding exactly ``cbox`` of canonical ``name`` (dims reversed when ``transpose``)."""
    shape = tuple(b - a for a, b in cbox)
    if transpose:
        shape = tuple(reversed(shape))
    return LocalTensor(local_name or name, shape, dtype, (Piece(name, tuple(cbox), full_box(shape), transpose),))


def sharded_side(
    side: str,
    tensors: Sequence[tuple[str, Sequence[int], int | None]],
    *,
    shards: int,
    replicas: int = 1,
    instances: int = 1,
    dtype: str = "bfloat16",
) -> SideLayout:
    """Every tensor ``(name, shape, dim)`` sharded on ``dim`` over ``shards`` ranks, ``replicas`` copies.

    Trainer: rank = replica * shards + shard. Rollout: ``instances`` identical instances of
    ``shards`` ranks each (``replicas`` ignored).
    """
    ranks = []
    groups = instances if side == "rollout" else replicas
    for grp in range(groups):
        for sh in range(shards):
            ts = tuple(local(name, shard_box(shape, dim, shards, sh), dtype) for name, shape, dim in tensors)
            rank = grp * shards + sh
            if side == "rollout":
                ranks.append(RankLayout(side, rank, ts, instance=grp, local_rank=sh))
            else:
                ranks.append(RankLayout(side, rank, ts, coords=(("dp", grp), ("tp", sh))))
    return SideLayout(side, tuple(ranks), num_instances=instances if side == "rollout" else 1)


def side_of(side: str, per_rank: Sequence[Sequence[LocalTensor]], instances: Sequence[int] | None = None) -> SideLayout:
    """A side from explicit per-rank tensor lists (rollout ranks may name their instance)."""
    ranks = []
    inst = list(instances) if instances is not None else [0] * len(per_rank)
    local_rank: dict[int, int] = {}
    for r, ts in enumerate(per_rank):
        lr = local_rank.get(inst[r], 0)
        local_rank[inst[r]] = lr + 1
        ranks.append(RankLayout(side, r, tuple(ts), instance=inst[r], local_rank=lr))
    return SideLayout(side, tuple(ranks), num_instances=len(set(inst)))


def local_for(name: str, cbox, dtype: str, how: int, suffix: str = "") -> LocalTensor:
    """0: same shape; 1: flattened 1-D view; 2: transposed (2-D only); 3: inside a padded bigger tensor."""
    shape = tuple(b - a for a, b in cbox)
    n = box_numel(cbox)
    if how == 1:
        return LocalTensor(name + suffix, (n,), dtype, (Piece(name, cbox, ((0, n),)),))
    if how == 2 and len(shape) == 2:
        ls = (shape[1], shape[0])
        return LocalTensor(name + suffix, ls, dtype, (Piece(name, cbox, ((0, ls[0]), (0, ls[1])), True),))
    if how == 3:
        ls = (shape[0] + 2, *shape[1:])
        lbox = ((1, shape[0] + 1), *((0, s) for s in shape[1:]))
        return LocalTensor(name + suffix, ls, dtype, (Piece(name, cbox, lbox),))
    return LocalTensor(name + suffix, shape, dtype, (Piece(name, cbox, tuple((0, s) for s in shape)),))


@st.composite
def layout_pairs(draw):
    ntensors = draw(st.integers(1, 3))
    tensors = []
    for t in range(ntensors):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
        tensors.append((f"t{t}", shape))
    S = draw(st.integers(1, 5))
    trainer_t: list[list[LocalTensor]] = [[] for _ in range(S)]
    tdt = draw(st.sampled_from(["float32", "bfloat16"]))
    for name, shape in tensors:
        dim = draw(st.sampled_from([None, *range(len(shape))]))
        k = draw(st.integers(1, 3)) if dim is not None else 1
        reps = draw(st.integers(1, 3))
        how = draw(st.integers(0, 3))
        for j in range(reps):
            for i in range(k):
                box = shard_box(shape, dim, k, i)
                if box_numel(box) == 0:
                    continue
                rank = (j * k + i) % S
                trainer_t[rank].append(local_for(name, box, tdt, how, suffix=f".{j}.{i}"))
    trainer = SideLayout("trainer", tuple(RankLayout("trainer", r, tuple(ts)) for r, ts in enumerate(trainer_t)))
    ninst = draw(st.integers(1, 3))
    L = draw(st.integers(1, 3))
    same = draw(st.booleans())
    ranks = []
    rdt = draw(st.sampled_from(["float32", "bfloat16"]))
    plans = []
    for name, shape in tensors:
        plans.append((draw(st.sampled_from([None, *range(len(shape))])), draw(st.integers(0, 3)),
                      draw(st.booleans())))
    for inst in range(ninst):
        if not same and inst > 0:
            plans = [(draw(st.sampled_from([None, *range(len(shape))])), h, tw) for (_, shape), (_, h, tw) in
                     zip(tensors, plans)]
        for lr in range(L):
            ts = []
            for (name, shape), (dim, how, twice) in zip(tensors, plans):
                box = shard_box(shape, dim, L, lr)
                if box_numel(box) == 0:
                    continue
                ts.append(local_for(name, box, rdt, how))
                if twice and lr == 0:
                    ts.append(local_for(name, box, rdt, 0, suffix=".copy"))  # held twice (tied)
            ranks.append(RankLayout("rollout", inst * L + lr, tuple(ts), instance=inst, local_rank=lr))
    rollout = SideLayout("rollout", tuple(ranks), num_instances=ninst)
    cap = draw(st.sampled_from([16, 64, 256, 1 << 20]))
    return trainer, rollout, cap
