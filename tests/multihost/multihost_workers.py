"""Rank bodies for the multi-host tests: full bridges on cluster hosts (``Cluster.launch`` runs them).

Each returns plain events (tuples) the test asserts on. The test process steers faults through
files in ``opts['dir']`` (the filesystem is shared by every namespace): trainer 0 writes
``cut-request`` after round 0 of version ``opts['cut']`` and waits for ``cut-done``; every trainer
waits for ``go-<v>`` before pushing a version listed in ``opts['wait_go']``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import BridgeError, TornModelError
from weightbridge.tensors import materialize, torch_dtype
from weightbridge.tensors import layout_mismatches as mismatches
from weightbridge.transport.errors import TransportError

TYPED = (BridgeError, TransportError)


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def wait_file(path: Path, limit_s: float) -> bool:
    """True once ``path`` exists; False after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def trainer(spec: str, rank: int, host: str, port: int, opts: dict) -> list[tuple]:
    """Push ``opts['versions']``; errors are events (the next version is pushed anyway)."""
    r = load_spec(spec)
    d = Path(opts["dir"])
    layout = r.trainer.ranks[rank]
    tensors = materialize(layout, canonical(r, 0))
    current = {"v": None}

    def on_round(index: int) -> None:
        if rank == 0 and current["v"] == opts.get("cut") and index == 0:
            (d / "cut-request").write_text(str(time.time()))
            wait_file(d / "cut-done", 30)

    bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, host=host, port=port,
                                     options=BridgeOptions(on_round=on_round))
    events: list[tuple] = []
    for v in opts["versions"]:
        if v in opts.get("wait_go", ()):
            wait_file(d / f"go-{v}", 60)
        fresh = materialize(layout, canonical(r, v))
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(fresh[name])
        current["v"] = v
        t0 = time.monotonic()
        try:
            s = bridge.push(v)
            events.append(("pushed", v, s.seconds, time.time()))
        except TYPED as exc:
            events.append(("error", v, type(exc).__name__, str(exc), time.time(), time.monotonic() - t0))
        (d / f"pushed-{rank}-{v}").write_text("1")
    if rank == 0:  # with sync.store trainer0 this process hosts the store: close after every rollout rank
        for q in range(r.rollout.world_size):
            wait_file(d / f"closed-rollout-{q}", 30)
    bridge.close()
    return events


def rollout(spec: str, rank: int, host: str, port: int, opts: dict) -> list[tuple]:
    """Poll/apply until ``opts['last']`` is applied (or ``opts['run_s']``); every apply verified bitwise.

    Events: ``("applied", v, mismatches)``, ``("error", type, message, torn)``, ``("torn-apply", ...)``
    (apply refused a torn model), and at the end ``("final", version, torn)`` and what the live
    weights hold then."""
    r = load_spec(spec)
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, canonical(r, -1), fill=7.0)
    bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, host=host, port=port)
    events: list[tuple] = []
    deadline = time.monotonic() + opts.get("run_s", 60)
    while time.monotonic() < deadline:
        try:
            if bridge.poll():
                v = bridge.apply()
                events.append(("applied", v, mismatches(layout, tensors, canonical(r, v)), time.time()))
                if v == 1:  # whether this rank forwards or receives forwarded bytes (receiver de-replication)
                    events.append(("forwards", any(b.src_side == "rollout" for rd in bridge.plan.rounds
                                                   for b in rd.buckets)))
                if v >= opts["last"]:
                    break
        except TornModelError as exc:
            events.append(("torn-apply", type(exc).__name__, str(exc), time.time()))
        except TYPED as exc:
            events.append(("error", type(exc).__name__, str(exc), bridge.torn, time.time()))
            if bridge.torn:
                try:
                    bridge.apply()
                except TornModelError as exc2:
                    events.append(("torn-apply", type(exc2).__name__, str(exc2), time.time()))
        time.sleep(0.005)
    v = bridge.version
    events.append(("final", v, bridge.torn, None if v is None else mismatches(layout, tensors, canonical(r, v))))
    bridge.close()
    (Path(opts["dir"]) / f"closed-rollout-{rank}").write_text("1")
    return events


def main(role: str, spec: str, rank: int, host: str, port: int, opts: dict) -> list[tuple]:
    return (trainer if role == "trainer" else rollout)(spec, rank, host, port, opts)


def hang(seconds: float) -> str:
    """Sleep ``seconds``; return this host's address (what the cleanup test launches)."""
    time.sleep(seconds)
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.200.0.254", 9))  # no packet is sent: picks the source address of the host's link
        return s.getsockname()[0]
