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
    who: str = "this rank", secret: str | bytes | None = None,
) -> tuple[ResolvedSpec, Any]:
    """``from_spec``'s common part (every rank): the resolved spec and the control store.

    The store is ``store`` when given (a ``TCPStore`` is wrapped to reconnect), else opened at
    ``host:port`` with the spec's deadline: hosted here when ``is_master`` (trainer rank 0) and
    the spec says ``sync.store: trainer0`` (the default); with ``sync.store: external`` every rank
    connects to a store that outlives the bridges (``weightbridge store``). Either way the store is a
    :class:`~weightbridge.transport.store_client.ReconnectingStore`: a dropped connection is
    re-opened within ``sync.timeout_s``, and a store that stays unreachable (``from_spec`` included)
    raises :class:`~weightbridge.errors.StoreUnreachable` naming ``who`` and ``host:port``. A hosted
    store is keyed by the job secret (``secret``: ``BridgeOptions.secret``, else as ``from_spec`` finds it),
    so that values without it never displace the job's (``docs/control_store.md``).
    """
    resolved = load_spec(spec)
    timeout_s = float(resolved.sync.timeout_s)
    from weightbridge.transport.store_client import ReconnectingStore, connect_store

    if store is None:
        if host is None or port is None:
            raise ValueError("pass host and port of the control store (trainer rank 0 hosts it unless the spec says "
                             "sync.store: external), or store=")
        hosts = is_master and resolved.sync.store == "trainer0"
        key = None
        if hosts:
            from weightbridge.sync.auth import secret_for

            key = secret_for(resolved, secret)[0]  # AuthError (how to provide one) before anything is hosted
        store = connect_store(host, int(port), timeout_s=timeout_s, who=who, is_master=hosts, secret=key)
    else:
        store = ReconnectingStore.around(store, timeout_s=timeout_s, who=who)
    return resolved, store


def device_of(tensors: Mapping[str, torch.Tensor]) -> torch.device:
    """The device of the first tensor (CPU when there is none)."""
    for t in tensors.values():
        return t.device
    return torch.device("cpu")
