"""Which data plane ``sync.transport`` names: the wire (:class:`~weightbridge.sync.dataplane.TransportDataPlane`)
or shared memory between colocated members (:class:`~weightbridge.transport.local_plane.LocalDataPlane`).

It sits above both (the local plane builds on the wire plane for its remote pairs), so neither imports the other
to be chosen.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from weightbridge.sync.dataplane import TransportDataPlane
from weightbridge.transport.local_plane import LocalDataPlane


def data_plane_for(transport: str, *, device: torch.device | str, checksums: bool, signer: Any = None,
                   delta: str = "off") -> Any:
    """The data plane of ``sync.transport`` for a rank whose tensors are on ``device``
    (:mod:`weightbridge.sync.dataplane`'s docstring)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    shm_here = sys.platform.startswith("linux") and os.path.isdir("/dev/shm")
    if transport in ("gloo", "nccl") or (transport == "auto" and (delta != "off" or not (cuda or shm_here))):
        return TransportDataPlane(transport=transport, device=device, checksums=checksums, signer=signer, delta=delta)
    if transport not in ("auto", "shm", "ipc"):
        raise ValueError(f"transport must be auto, gloo, nccl, shm or ipc, got {transport!r}")
    kind = transport if transport != "auto" else ("ipc" if cuda else "shm")
    policy = "shared-gpu" if transport == "auto" and cuda else "host"
    return LocalDataPlane(kind=kind, policy=policy, device=device, checksums=checksums, signer=signer, delta=delta)
