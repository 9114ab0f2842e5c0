"""Trainer IR straight from DTensor placements (FSDP2, tensor parallel, HSDP, ...).

For each parameter, the global indices a rank holds along each tensor dim are computed
by torch itself: a 1-D index vector (shape 1 on the other dims) is distributed with the
parameter's mesh and placements restricted to that dim (others -> ``Replicate``),
``src_data_rank=None`` so no communication happens. Sharding is per dim, so the local
tensor is the outer product of those index vectors; runs of consecutive indices give
the boxes. This handles ``Shard``, ``Replicate`` and ``_StridedShard`` (whose local rows
need not be one contiguous range: several pieces are emitted then) alike, uneven
chunks included. ``Partial`` placements are refused (a partial sum is no weight).
A parameter transformers fused from per-expert checkpoint tensors (``fused=``, read from
transformers' conversion mapping by :mod:`weightbridge.probe.fused`) is cut into one piece per
held expert and part, under the checkpoint's names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import product

import torch

from weightbridge.layout.ir import LocalTensor, Piece, RankLayout
from weightbridge.probe.fused import FusedParam, fused_pieces, index_runs
from weightbridge.tensors import dtype_name


def dim_indices(mesh, placements, shape: tuple[int, ...], dim: int) -> list[int]:
    """Global indices along ``dim`` held by this rank under ``placements`` on ``mesh``."""
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.placement_types import Partial, Shard, _StridedShard

    own = []
    for p in placements:
        if isinstance(p, Partial):
            raise ValueError(f"placement {p} (a partial sum) does not hold weights")
        # _StridedShard is not a Shard subclass in every torch version
        own.append(p if isinstance(p, (Shard, _StridedShard)) and p.dim == dim else Replicate())
    view = [1] * len(shape)
    view[dim] = shape[dim]
    ids = torch.arange(shape[dim], dtype=torch.int64).reshape(view)
    if all(isinstance(p, Replicate) for p in own):
        return list(range(shape[dim]))
    local = distribute_tensor(ids, mesh, own, src_data_rank=None).to_local()
    return [int(x) for x in local.reshape(-1).tolist()]


def layout_from_dtensors(
    named_params: Mapping[str, torch.Tensor],
    *,
    side: str = "trainer",
    rank: int | None = None,
    name_map: Callable[[str], str | None] | None = None,
    instance: int = 0,
    local_rank: int | None = None,
    fused: Mapping[str, FusedParam] | None = None,
) -> RankLayout:
    """The rank's layout IR from its (DTensor or plain) parameters.

    Local names are the given names; ``name_map(local) -> canonical name`` (default: the
    same name; ``None`` skips the parameter). A plain tensor is taken as the full canonical
    tensor. ``rank`` defaults to the default process group's rank (0 without one).
    ``fused``: local name -> how transformers built it from per-expert checkpoint tensors
    (:func:`weightbridge.probe.fused.fused_params`, from transformers' conversion mapping); such a
    parameter gets one piece per held expert and part, named by the checkpoint, not by ``name_map``.
    """
    from torch.distributed.tensor import DTensor

    if rank is None:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    coords: dict[str, int] = {}
    tensors = []
    for name, p in named_params.items():
        canon = name_map(name) if name_map is not None else name
        if canon is None:
            continue
        if isinstance(p, DTensor):
            gshape = tuple(p.shape)
            local = p.to_local()
            mesh = p.device_mesh
            names = mesh.mesh_dim_names or tuple(f"mesh{i}" for i in range(mesh.ndim))
            coord = mesh.get_coordinate()
            if coord is not None:
                coords.update(zip(names, coord))
            per_dim = [dim_indices(mesh, p.placements, gshape, d) for d in range(len(gshape))]
            lshape = tuple(len(ix) for ix in per_dim)
            if lshape != tuple(local.shape):
                raise ValueError(f"{name}: placements give local shape {lshape}, to_local() has {tuple(local.shape)}")
        else:
            local = p
            lshape = tuple(p.shape)
            gshape = lshape
            per_dim = [list(range(n)) for n in lshape]
        pieces = []
        if fused is not None and name in fused:
            if fused[name].shape != gshape:
                raise ValueError(f"{name}: shape {list(gshape)}, described as fused {list(fused[name].shape)}")
            pieces = fused_pieces(fused[name], per_dim) if all(lshape) else []
        elif not lshape:
            pieces.append(Piece(canon, (), (), False))
        elif all(lshape):
            for combo in product(*[index_runs(ix) for ix in per_dim]):
                lbox = tuple((a, b) for a, b, _ in combo)
                cbox = tuple((g, g + b - a) for a, b, g in combo)
                pieces.append(Piece(canon, cbox, lbox, False))
        tensors.append(LocalTensor(name, lshape, dtype_name(local.dtype), tuple(pieces)))
    return RankLayout(
        side=side,
        rank=rank,
        tensors=tuple(tensors),
        instance=instance,
        local_rank=rank if local_rank is None else local_rank,
        coords=tuple(sorted(coords.items())),
    )
