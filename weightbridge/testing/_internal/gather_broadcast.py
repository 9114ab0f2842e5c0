"""The gather-then-broadcast baseline, run for real (``bench/transfer_gloo.py``, ``bench/cluster.py``).

What most RL frameworks do to update rollout engines (slime, OpenRLHF, verl's default), on the
same processes and weights as weightbridge so one run compares both: per canonical tensor, the
trainer ranks all-gather their shards (when trainer rank 0 does not hold it whole), trainer rank 0
assembles the full tensor and broadcasts it to every rollout rank (one group: trainer rank 0 plus
all rollout ranks, rollout rank ``q`` at group rank ``1 + q``), and each rollout rank slices its
part into its local tensors.

Every trainer rank and every rollout rank calls :meth:`GatherBroadcast.run` together. ``tgroup``
is a Gloo group of the trainer ranks (trainer rank ``t`` at rank ``t``; None on rollout ranks),
``bgroup`` the broadcast group (None on trainer ranks other than 0). Element type on the wire:
the trainer's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from weightbridge.layout.box import box_shape
from weightbridge.tensors import read_canonical, torch_dtype, write_canonical


def _sl(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def _numel(box) -> int:
    return math.prod(box_shape(box))


class GatherBroadcast:
    """One rank's part of gather-then-broadcast over ``resolved``'s layouts (module docstring)."""

    def __init__(self, resolved: Any, side: str, rank: int, local: dict[str, torch.Tensor], tgroup: Any,
                 bgroup: Any) -> None:
        self.r, self.side, self.rank, self.local = resolved, side, rank, local
        self.tgroup, self.bgroup = tgroup, bgroup
        tlayouts = resolved.trainer.ranks
        self.by_name_t: list[dict] = [{} for _ in tlayouts]  # per trainer rank: canonical -> [(local name, piece)]
        for t, lay in enumerate(tlayouts):
            for lt, p in lay.pieces():
                self.by_name_t[t].setdefault(p.canonical, []).append((lt.name, p))
        layout = (resolved.trainer if side == "trainer" else resolved.rollout).ranks[rank]
        self.mine: dict = {}
        for lt, p in layout.pieces():
            self.mine.setdefault(p.canonical, []).append((lt.name, p))
        self.dtype = torch_dtype(tlayouts[0].tensors[0].dtype)

    def run(self) -> int:
        """Move every canonical tensor; returns the bytes this rank received (gathered or broadcast)."""
        moved = 0
        for ct in self.r.canonical:
            full = None
            if self.side == "trainer":
                full, n = self.gather(ct)
                moved += n
            if self.bgroup is not None:
                if full is None:
                    full = torch.empty(ct.shape, dtype=self.dtype)
                self.bgroup.broadcast(full, 0).wait()
                if self.side == "rollout":
                    moved += full.numel() * full.element_size()
                    self.scatter(ct, full)
        return moved

    def gather(self, ct: Any, into: torch.Tensor | None = None) -> tuple[torch.Tensor | None, int]:
        """Trainer ranks (all together): canonical tensor ``ct`` whole on trainer rank 0 (written into
        ``into`` when given; None elsewhere) and the bytes this rank received for it."""
        S, rank, local, by_name_t, tdtype = self.r.trainer.world_size, self.rank, self.local, self.by_name_t, self.dtype
        moved = 0
        numel = [sum(_numel(p.canonical_box) for _, p in by_name_t[t].get(ct.name, [])) for t in range(S)]
        on_0 = by_name_t[0].get(ct.name, [])
        full_on_0 = numel[0] == math.prod(ct.shape) and len({p.canonical_box for _, p in on_0}) == len(on_0)
        full = None
        if full_on_0:
            if rank == 0:
                full = into if into is not None else torch.empty(ct.shape, dtype=tdtype)
                for tname, p in on_0:
                    full[_sl(p.canonical_box)] = read_canonical(local[tname], p.local_box, p.transpose,
                                                                box_shape(p.canonical_box))
            return full, moved
        parts = [read_canonical(local[tname], p.local_box, p.transpose, box_shape(p.canonical_box)).reshape(-1)
                 for tname, p in by_name_t[rank].get(ct.name, [])]
        flat = torch.cat(parts) if parts else torch.empty(0, dtype=tdtype)
        pad = max(numel)
        send = torch.zeros(pad, dtype=tdtype)
        send[: flat.numel()] = flat
        outs = [torch.empty(pad, dtype=tdtype) for _ in range(S)]
        self.tgroup.allgather([outs], [send]).wait()
        moved += (S - 1) * pad * send.element_size()
        if rank == 0:
            full = into if into is not None else torch.empty(ct.shape, dtype=tdtype)
            for t in range(S):
                off = 0
                for _, p in by_name_t[t].get(ct.name, []):
                    n = _numel(p.canonical_box)
                    full[_sl(p.canonical_box)] = outs[t][off: off + n].view(box_shape(p.canonical_box))
                    off += n
        return full, moved

    def scatter(self, ct: Any, full: torch.Tensor) -> None:
        """A rollout rank: its parts of canonical tensor ``ct`` from the whole tensor ``full``."""
        for tname, p in self.mine.get(ct.name, []):
            write_canonical(self.local[tname], p.local_box, p.transpose, full[_sl(p.canonical_box)])
