"""Which host and which device a rank's bytes live on: the identity every rank's ``Hello`` carries.

The handshake (:func:`weightbridge.sync.handshake.check_hellos`) compares them before the epoch's
bridge group exists, so that a CPU-offloaded trainer (Gloo) next to CUDA rollouts (NCCL), or two
members of one NCCL group on one GPU, fail with a typed error naming both ranks instead of a
misleading timeout or a hang inside NCCL. The shared-memory transport uses the same host identity to
tell which pairs share a host.

* :func:`host_identity`: equal for the processes of one host in one network namespace, different
  across hosts and across network namespaces of one host (how tests simulate hosts, see RECIPES):
  a digest of the kernel's boot id and the network namespace's inode, the hostname where ``/proc``
  lacks them (not Linux).
* :func:`device_identity`: ``cpu``, or the GPU's UUID (``GPU-...``, ``MIG-...`` under MIG), which every
  process sees alike whatever ``CUDA_VISIBLE_DEVICES`` numbers it; ``cuda:<index>`` only where torch
  reports no UUID.

Torch only (no ``torch.distributed``); nothing here initialises CUDA for a CPU device.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from typing import Any

import torch

from weightbridge.sync.messages import DeviceIdentity

__all__ = ["DeviceIdentity", "device_identity", "gpu_uuid", "host_identity", "identity_of"]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def host_identity() -> str:
    """16 hex digits: equal for every process of this host and network namespace (module docstring)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        netns = os.readlink("/proc/self/ns/net")  # "net:[4026531833]": the namespace's inode
    except OSError:
        netns = ""
    basis = f"{boot}|{netns}" if boot else f"host|{socket.gethostname()}"
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def gpu_uuid(device: torch.device) -> str | None:
    """The UUID of CUDA ``device`` as NVIDIA names it (``GPU-...`` / ``MIG-...``), or None where torch has none."""
    try:
        raw = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def device_identity(device: torch.device | str, *, uuid: Any = gpu_uuid) -> tuple[str, str]:
    """``(identity, label)`` of ``device``: ``("cpu", "cpu")``, ``("GPU-...", "cuda:1")``; ``uuid(device)``
    reads a CUDA device's UUID (a unit test passes a function of its own)."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type, device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    label = f"cuda:{index}"
    found = uuid(torch.device("cuda", index))
    return (found or label), label


def identity_of(backend: str, device: torch.device | str, *, uuid: Any = gpu_uuid) -> DeviceIdentity:
    """This rank's :class:`DeviceIdentity`: ``backend`` (resolved, e.g. by ``backend_for``) on ``device``."""
    ident, label = device_identity(device, uuid=uuid)
    return DeviceIdentity(backend=backend, host=host_identity(), device=ident, label=label)
