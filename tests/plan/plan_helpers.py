"""Small builders of SideLayouts for planner tests (no spec files)."""

from __future__ import annotations

from collections.abc import Sequence

from weightbridge.layout.box import full_box
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
