"""The rendezvous store shared by the data plane (bridge group) and the control plane."""

from __future__ import annotations

import datetime

import torch.distributed as dist

Store = dist.Store


def open_store(
    host: str,
    port: int,
    *,
    is_master: bool,
    world_size: int | None = None,
    timeout_s: float,
) -> dist.Store:
    """Open (``is_master``: host) a ``TCPStore`` at ``host:port``.

    The master may pass ``port=0`` to get a free port, read back as ``store.port``. The master
    never blocks waiting for workers (``wait_for_workers=False``); clients connect within
    ``timeout_s`` and every ``get``/``wait`` on the store is bounded by ``timeout_s``.
    ``world_size`` is informative only (None: unknown).
    """
    return dist.TCPStore(
        host,
        int(port),
        world_size,
        is_master,
        datetime.timedelta(seconds=float(timeout_s)),
        wait_for_workers=False,
    )
