"""Process bodies for ``test_delta_bridge_mp.py``: the bridge with ``sync.delta`` over many versions.

Version ``v``'s weights are an fp32 master after ``v`` deterministic optimizer-like steps (every
element moves by ``lr`` in a random direction), the same in every process, so only the elements
that cross a bf16 rounding boundary change between versions. Events are plain tuples.
"""

from __future__ import annotations

import os
import signal
import time

import torch

import sync_mp_workers as W
from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import TornModelError
from weightbridge.tensors import layout_mismatches
from weightbridge.tensors import materialize

LR = 2e-5
_state: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    """The fp32 master of ``version`` (computed incrementally, cached per process)."""
    key = id(resolved)
    got = _state.get(key)
    if got is None or got[0] > version:
        g = torch.Generator().manual_seed(4242)
        got = (0, {t.name: torch.randn(t.shape, generator=g) * 0.02 for t in resolved.canonical.tensors})
    v, tensors = got
    while v < version:
        v += 1
        g = torch.Generator().manual_seed(7919 * v)
        for name in sorted(tensors):
            t = tensors[name]
            t += LR * (torch.randint(0, 2, t.shape, generator=g, dtype=torch.float32) * 2 - 1)
    _state[key] = (v, tensors)
    return tensors


def trainer(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """Push ``opts['versions']``; ``opts['kill']`` = (version, round): SIGKILL self there;
    ``opts['after_kill']``: start once the kill happened (a restarted rank); ``opts['wait_for']``:
    ``{version: key}``, wait for that store key before pushing that version."""
    r = load_spec(spec)
    store = W._store(port, r.sync.timeout_s)
    if opts.get("after_kill"):
        while not store.check(["test/killed_at"]):
            time.sleep(0.01)
    layout = r.trainer.ranks[rank]
    versions = opts["versions"]
    tensors = materialize(layout, canonical(r, versions[0]))
    current = {"v": None}
    kill = opts.get("kill")

    def on_round(index: int) -> None:
        if kill is not None and current["v"] == kill[0] and index >= kill[1]:
            store.set("test/killed_at", str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, store=store,
                                     options=BridgeOptions(on_round=on_round))
    events: list[tuple] = []
    for v in versions:
        fresh = materialize(layout, canonical(r, v))
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(fresh[name])
        current["v"] = v
        if v in opts.get("wait_for", {}):
            while not store.check([opts["wait_for"][v]]):
                time.sleep(0.01)
        try:
            s = bridge.push(v)
            events.append(("pushed", v, s.epoch, s.new_epoch, s.bytes_sent, s.wire_sent, s.delta_buckets))
        except W.TYPED as exc:
            events.append(("error", v, type(exc).__name__, str(exc), time.time()))
        store.set(f"test/pushed/{rank}/{v}", "1")
    store.set(f"test/trainer-done/{rank}", "1")
    bridge.close()
    return events


def rollout(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """Poll/apply until ``opts['last']``, checking every applied version bitwise.

    ``opts['rejoin_after']``: after applying that version, leave and join again as a new bridge over
    fresh (garbage) tensors; ``opts['start_key']``: wait for it first (a late joiner)."""
    r = load_spec(spec)
    store = W._store(port, r.sync.timeout_s)
    if opts.get("start_key"):
        while not store.check([opts["start_key"]]):
            time.sleep(0.01)
    layout = r.rollout.ranks[rank]
    staging = opts.get("staging", True)

    def join():
        tensors = materialize(layout, W.canonical(r, -1), fill=7.0)
        return RolloutBridge.from_spec(r, rank=rank, tensors=tensors, store=store, staging=staging), tensors

    bridge, tensors = join()
    events: list[tuple] = []
    deadline = time.monotonic() + opts.get("run_s", 90)
    rejoin = opts.get("rejoin_after")
    while time.monotonic() < deadline:
        try:
            if bridge.poll():
                v = bridge.apply()
                rs = bridge.last_receive
                events.append(("applied", v, layout_mismatches(layout, tensors, canonical(r, v)),
                               rs.bytes_received if rs else 0, rs.wire_received if rs else 0))
                if v >= opts["last"]:
                    break
                if rejoin is not None and v >= rejoin:
                    rejoin = None
                    bridge.close()
                    bridge, tensors = join()
                    events.append(("rejoined", v))
                    store.set(f"test/rejoined/{rank}", "1")
        except TornModelError as exc:
            events.append(("torn-apply", type(exc).__name__, str(exc)))
        except W.TYPED as exc:
            events.append(("error", type(exc).__name__, str(exc), bridge.torn))
        time.sleep(0.002)
    events.append(("final", bridge.version, bridge.torn))
    bridge.close()
    return events


def main(role: str, spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    return (trainer if role == "trainer" else rollout)(spec, rank, port, opts)
