"""Check local tensors bitwise against canonical ones, through the layout IR (tests, demo).

(Build expected local tensors with :func:`weightbridge.tensors.materialize`.) :func:`mismatches` walks a rank's :class:`~weightbridge.layout.ir.RankLayout` pieces: the
canonical box of each piece against the local box it lives in. Padding elements (no
piece) are neither written nor checked.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weightbridge.layout.box import box_shape, format_box
from weightbridge.layout.ir import RankLayout
from weightbridge.tensors import bitwise_equal, read_canonical


def _slices(box):
    return tuple(slice(a, b) for a, b in box)


def mismatches(layout: RankLayout, tensors: Mapping[str, torch.Tensor], canonical: Mapping[str, torch.Tensor],
               limit: int = 5) -> list[str]:
    """Pieces of ``layout`` whose local values differ bitwise from ``canonical`` (cast to the local dtype)."""
    out: list[str] = []
    for t in layout.tensors:
        local = tensors[t.name]
        for p in t.pieces:
            got = read_canonical(local, p.local_box, p.transpose, box_shape(p.canonical_box))
            want = canonical[p.canonical][_slices(p.canonical_box)].to(local.dtype)
            if not bitwise_equal(got, want):  # bits (FP8 has no torch.equal)
                out.append(f"{layout.side} {layout.rank} {t.name}{format_box(p.local_box)} != "
                           f"{p.canonical}{format_box(p.canonical_box)}")
                if len(out) >= limit:
                    return out
    return out
