"""A rollout rank's own receive tensors: the staging copy, or (streaming) shapes only.

:func:`staging_copy` is the copy a staging rank receives into (one shard of the rank, on its
device or in host memory: ``sync.staging_memory``, ``docs/memory.md``); :func:`layout_shapes` the
meta tensors a streaming rank (``RolloutBridge(tensors=None)``) stands in for its local tensors
with (shapes and dtypes for the checks, the handshake and the executor; no memory).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weightbridge.layout.ir import RankLayout
from weightbridge.spec.resolve import ResolvedSpec


def staging_copy(layout: RankLayout, tensors: Mapping[str, torch.Tensor], *, live: bool = True,
                 where: str = "device", device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """A copy of the layout's tensors to receive into: on ``device`` (default: each tensor's) or, with
    ``where="host"``, in CPU memory (pinned when the device is a GPU); holding the live values
    (``live``), else zeros (a streaming rank's shapes, ``tensors`` on the meta device)."""
    out = {}
    for t in layout.tensors:
        src = tensors[t.name]
        dev = torch.device("cpu") if where == "host" else (device if device is not None else src.device)
        pin = where == "host" and device is not None and device.type == "cuda"
        buf = torch.empty(tuple(src.shape), dtype=src.dtype, device=dev, pin_memory=pin)
        out[t.name] = buf.copy_(src.detach()) if live else buf.zero_()
    return out


def layout_shapes(resolved: ResolvedSpec, rank: int) -> dict[str, torch.Tensor]:
    """A streaming rank's local tensors as meta tensors (shapes and dtypes, no memory)."""
    from weightbridge.tensors import torch_dtype

    if not 0 <= rank < resolved.rollout.world_size:
        raise ValueError(f"rollout rank {rank} outside [0, {resolved.rollout.world_size}) of the spec")
    return {t.name: torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="meta")
            for t in resolved.rollout.ranks[rank].tensors}
