"""Opening a bridge: the resolved spec (``load_spec``, from :mod:`weightbridge.spec.resolve`) and the
control store (every rank, in ``from_spec``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weightbridge.spec.resolve import ResolvedSpec, load_spec

__all__ = ["connect", "device_of", "load_spec"]


def connect(
    spec: str | Path | ResolvedSpec, host: str | None, port: int | None, store: Any, *, is_master: bool,
) -> tuple[ResolvedSpec, Any]:
    """``from_spec``'s common part: the resolved spec and the control store (given, else opened at
    ``host:port`` with the spec's deadline; hosted when ``is_master``: trainer rank 0)."""
    resolved = load_spec(spec)
    if store is None:
        if host is None or port is None:
            raise ValueError("pass host and port of the control store (trainer rank 0 hosts it), or store=")
        from weightbridge.transport.store import open_store

        store = open_store(host, port, is_master=is_master, timeout_s=float(resolved.sync.timeout_s))
    return resolved, store


def device_of(tensors: Mapping[str, torch.Tensor]) -> torch.device:
    """The device of the first tensor (CPU when there is none)."""
    for t in tensors.values():
        return t.device
    return torch.device("cpu")
