"""The rendezvous store shared by the data plane (bridge group) and the control plane.

``open_store`` is public (``weightbridge.open_store``): a launcher hosts the store with it when
trainer rank 0 should not (so ranks may stop in any order). A hosted store is the bounded server of
:mod:`.store_server` in a child process (torch's own ``TCPStore`` server keeps whatever anyone writes);
clients are torch's ``TCPStore`` clients, or the bridges' own (:mod:`.store_client`).
"""

from __future__ import annotations

import datetime
import os
import socket
import weakref
from typing import Any

import torch.distributed as dist

Store = dist.Store


class HostedStore(dist.TCPStore):
    """A ``TCPStore`` client of a bounded store served by a child process of this one
    (:func:`weightbridge.transport.store_host.spawn`): the store lives as long as this object (or this
    process). ``store_id``: the id the server set (:data:`~weightbridge.transport.store_server.STORE_ID_KEY`)."""

    server: Any  # the child's Popen
    store_id: str


def _stop(proc: Any) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the server exits at once when its stdin closes
        proc.wait(5)
    except Exception:  # noqa: BLE001 - best effort at teardown
        proc.kill()


def _host(host: str, port: int, timeout_s: float, secret: bytes | None) -> HostedStore:
    from weightbridge.transport.store_host import spawn
    from weightbridge.transport.store_server import STORE_ID_KEY

    listener = socket.socket(fileno=listen_socket(host, int(port)))
    bound_port = listener.getsockname()[1]  # port 0: the one the OS chose
    proc = spawn(listener, secret=secret)
    try:
        client = HostedStore(host, bound_port, None, False, datetime.timedelta(seconds=float(timeout_s)))
        client.server = proc
        client.store_id = client.get(STORE_ID_KEY).decode()
    except BaseException:
        _stop(proc)
        raise
    weakref.finalize(client, _stop, proc)
    return client


def open_store(
    host: str,
    port: int,
    *,
    is_master: bool,
    world_size: int | None = None,
    timeout_s: float,
    secret: str | bytes | None = None,
) -> dist.Store:
    """Open the control store every bridge process rendezvous on: host it (``is_master=True``)
    or connect to it (``is_master=False``) at ``host:port``. Public as ``weightbridge.open_store``.

    You need it only to host the store **outside trainer rank 0**. By default trainer rank 0's
    ``TrainerBridge.from_spec(..., host=H, port=P)`` hosts it and every other rank connects, so
    rank 0 must stop last (it takes the store with it). To let ranks stop in any order, host it
    in a process that outlives them (the launcher, a driver, a Ray actor)::

        # the hosting process, before any rank connects; keep `store` alive until every rank closed
        store = weightbridge.open_store("0.0.0.0", 0, is_master=True, timeout_s=300)
        port = store.port                                  # port=0: a free port chosen by the OS

        # every trainer rank, rank 0 included (passing store= means no bridge hosts one)
        store = weightbridge.open_store(H, port, is_master=False, timeout_s=300)
        bridge = TrainerBridge.from_spec(spec, rank=t, tensors=shards, store=store)

        # every rollout rank: store= the same way, or host=H, port=port (rollout ranks never host)
        bridge = RolloutBridge.from_spec(spec, rank=r, tensors=params, host=H, port=port)

    The store carries only small control messages; the weights travel over the bridge's own
    process group, whose rendezvous uses the same store under the bridges' ``prefix``.

    Hosting starts the bounded store (:mod:`weightbridge.transport.store_server`) in a child process
    that lives as long as the returned client (and never longer than this process); ``secret``
    (default ``$WEIGHTBRIDGE_SECRET``, if set; ``b""``: none): the job secret, so that no value written
    without it can displace or replace the job's (``docs/control_store.md``: what the store holds). Clients
    connect within ``timeout_s``. ``world_size`` is informative only (None: unknown).

    The hosting store listens on ``host``'s address only (:func:`listen_socket`): ``127.0.0.1`` /
    ``localhost`` = loopback, reachable from this machine only; ``0.0.0.0`` (or ``::``) = every
    interface, as ``TCPStore`` itself would do whatever it is given.
    """
    if is_master:
        if secret is None:
            secret = os.environ.get("WEIGHTBRIDGE_SECRET") or None
        secret = secret.encode() if isinstance(secret, str) else secret
        return _host(host, int(port), timeout_s, secret or None)  # b"": not keyed (a spec with auth: off)
    return dist.TCPStore(host, int(port), world_size, False, datetime.timedelta(seconds=float(timeout_s)))


def listen_socket(host: str, port: int) -> int:
    """A listening TCP socket bound to ``host``'s address (not every interface), as a file descriptor
    that the hosting ``TCPStore`` takes over (``master_listen_fd``; Python no longer owns it).

    ``torch.distributed.TCPStore`` binds every interface even when given ``127.0.0.1``; binding the
    socket here makes it listen where the user says. ``host`` ``""``, ``0.0.0.0`` or ``::``: every
    interface. A name resolves to its first address (``localhost``: loopback). ``port`` 0: a free port.
    """
    if host in ("", "0.0.0.0", "::", "*"):
        family, addr = (socket.AF_INET6, ("::", port)) if host == "::" else (socket.AF_INET, ("0.0.0.0", port))
    else:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        info.sort(key=lambda i: i[0] != socket.AF_INET)  # IPv4 first (what TCPStore's clients try first)
        family, addr = info[0][0], info[0][4]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(4096)
    except BaseException:
        sock.close()
        raise
    return sock.detach()
