"""Process bodies for the hostile-client tests (tests/sync/test_auth_mp.py), run through ``launch``.

Each takes the secret it should use explicitly (``None``: none), so genuine ranks and strangers
run side by side. Every body returns plain events (tuples).
"""

from __future__ import annotations

import os
import time

import torch

from weightbridge.bridge import RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import BridgeError
from weightbridge.sync.auth import ENV, Signer, data_token
from weightbridge.tensors import materialize, torch_dtype
from weightbridge.transport.store import open_store

HOST = "127.0.0.1"


def _weights(resolved, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def _secret(secret: str | None) -> None:
    if secret is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = secret


def stranger_trainer(spec: str, rank: int, port: int, secret: str | None) -> list[tuple]:
    """A process posing as trainer ``rank`` with the public API and no/the wrong secret: push version 999."""
    _secret(secret)
    r = load_spec(spec)
    store = open_store(HOST, port, is_master=False, timeout_s=r.sync.timeout_s)
    tensors = materialize(r.trainer.ranks[rank], _weights(r, 999))
    try:
        b = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, store=store)
        b.push(999)
    except BridgeError as exc:
        return [("error", type(exc).__name__, str(exc))]
    return [("pushed", 999)]


def genuine_rollout(spec: str, rank: int, port: int, secret: str, run_s: float) -> list[tuple]:
    """A real rollout rank polling for ``run_s``: every version it applied, every typed error it saw."""
    _secret(secret)
    r = load_spec(spec)
    store = open_store(HOST, port, is_master=False, timeout_s=r.sync.timeout_s)
    tensors = materialize(r.rollout.ranks[rank], _weights(r, -1), fill=7.0)
    b = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, store=store, staging=rank % 2 == 0)
    events: list[tuple] = []
    end = time.monotonic() + run_s
    while time.monotonic() < end:
        try:
            if b.poll():
                events.append(("applied", b.apply()))
        except BridgeError as exc:
            events.append(("error", type(exc).__name__, str(exc)[:300]))
        time.sleep(0.01)
    events.append(("final", b.version, b.torn))
    b.close()
    return events


def data_group_member(rank: int, port: int, secret: str, seal: bool) -> tuple:
    """One member of a 3-rank bridge group (1 trainer, 2 rollout) running the data-sender check with every peer.

    ``seal``: the group's rendezvous is sealed with the member's secret (else plain c10d keys, the
    case of a stranger that took a rank's place there). Returns ("ok", seconds) or ("error", type, message).
    """
    from weightbridge.transport.group import create_bridge_group
    from weightbridge.transport.peerauth import authenticate_peers

    signer = Signer(secret.encode())
    store = open_store(HOST, port, is_master=False, timeout_s=10)
    names = ["trainer/0", "rollout/0", "rollout/1"]
    try:
        g = create_bridge_group(store, rank=rank, world_size=3, num_trainers=1, backend="gloo", timeout_s=5,
                                prefix=f"auth/{seal}", signer=signer if seal else None)
        try:
            dt = authenticate_peers(g, [p for p in range(3) if p != rank],
                                    lambda s, d: data_token(signer, 1, names[s], "n", names[d], "n"))
        finally:
            g.close(abort=True)
    except BridgeError as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("ok", dt)
