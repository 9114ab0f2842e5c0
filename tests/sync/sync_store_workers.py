"""Process bodies for the external-store tests (``test_external_store_mp.py``; run by ``launch``).

The bridge's control store is a ``weightbridge store`` process (spec ``sync.store: external``); every
rank, trainer 0 included, connects to it with ``from_spec(host=, port=)``. The test's own keys
(kills, progress) live on a second store the test process hosts, which nobody kills.
Each body returns a list of plain event tuples.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import BridgeError, StoreUnreachable, TornModelError
from weightbridge.tensors import layout_mismatches, materialize, torch_dtype
from weightbridge.transport.errors import TransportError
from weightbridge.transport.store import open_store

HOST = "127.0.0.1"
TYPED = (BridgeError, TransportError)


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def _wait_key(store, key: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not store.check([key]) and time.monotonic() < deadline:
        time.sleep(0.01)


def trainer(spec: str, rank: int, port: int, test_port: int, opts: dict) -> list[tuple]:
    """Push ``opts['versions']``. ``kill`` = (version, round): SIGKILL self after that round;
    ``after_kill``: start once the test's ``killed_at`` key exists (the restarted process);
    ``wait`` = {version: key}: wait for a test key before pushing that version. A push that raises
    ``StoreUnreachable`` rebuilds the bridge (``from_spec`` again) and pushes the same version again.
    ``damage``: versions whose first data message gets one byte flipped after its checksum (in flight);
    ``await_errors`` = n: after a failed push, wait until rollout ranks 0..n-1 each reported as many errors.
    """
    os.environ["WEIGHTBRIDGE_SECRET"] = opts["secret"]
    r = load_spec(spec)
    test = open_store(HOST, test_port, is_master=False, timeout_s=60)
    if opts.get("after_kill"):
        _wait_key(test, "test/killed_at")
    layout = r.trainer.ranks[rank]
    tensors = materialize(layout, canonical(r, 0))
    current = {"v": None}
    kill = opts.get("kill")

    def on_round(index: int) -> None:
        if kill is not None and current["v"] == kill[0] and index >= kill[1]:
            test.set("test/killed_at", str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    damage = set(opts.get("damage", ()))
    if damage:  # flip one byte of the first data message this rank sends in each damaged push
        from weightbridge.testing._internal.wire_tamper import flip_sent_bytes

        flipped: set = set()

        def choose(part: torch.Tensor, peer: int) -> int | None:
            if current["v"] not in damage or current["v"] in flipped:
                return None
            flipped.add(current["v"])
            return (current["v"] * 7919) % part.numel()

        flip_sent_bytes(choose)

    def build() -> TrainerBridge:
        return TrainerBridge.from_spec(r, rank=rank, tensors=tensors, host=HOST, port=port,
                                       options=BridgeOptions(on_round=on_round))

    events: list[tuple] = []
    bridge = build()
    for v in opts["versions"]:
        fresh = materialize(layout, canonical(r, v))
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(fresh[name])
        current["v"] = v
        if v in opts.get("wait", {}):
            _wait_key(test, opts["wait"][v])
        for attempt in range(2):
            t0 = time.time()
            try:
                s = bridge.push(v)
                events.append(("pushed", v, s.epoch, time.time()))
                break
            except StoreUnreachable as exc:
                events.append(("store-error", v, exc.restarted, str(exc), t0, time.time()))
                bridge.close()
                bridge = build()  # the store is back (or from_spec raises StoreUnreachable itself)
            except TYPED as exc:
                events.append(("error", v, type(exc).__name__, str(exc), time.time()))
                errors = sum(1 for e in events if e[0] == "error")
                for rr in range(opts.get("await_errors", 0)):  # every rollout rank saw this failure too
                    limit = time.monotonic() + 30
                    while int(test.add(f"test/errors/{rr}", 0)) < errors and time.monotonic() < limit:
                        time.sleep(0.01)
                break
        test.set(f"test/pushed/{rank}/{v}", "1")
    test.set(f"test/trainer-done/{rank}", "1")
    bridge.close()
    return events


def rollout(spec: str, rank: int, port: int, test_port: int, opts: dict) -> list[tuple]:
    """Poll/apply until ``opts['last']`` is applied, verifying every applied version bitwise; on
    ``StoreUnreachable`` rebuild the bridge over the same live tensors (they keep serving)."""
    os.environ["WEIGHTBRIDGE_SECRET"] = opts["secret"]
    r = load_spec(spec)
    test = open_store(HOST, test_port, is_master=False, timeout_s=60)
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, canonical(r, -1), fill=7.0)
    staging = opts.get("staging", True)

    def build() -> RolloutBridge:
        return RolloutBridge.from_spec(r, rank=rank, tensors=tensors, host=HOST, port=port, staging=staging)

    events: list[tuple] = []
    bridge = build()
    served = None  # the version the live tensors hold (survives a rebuild)
    deadline = time.monotonic() + opts.get("run_s", 60)
    while time.monotonic() < deadline:
        try:
            if bridge.poll():
                v = bridge.apply()
                served = v
                events.append(("applied", v, layout_mismatches(layout, tensors, canonical(r, v)), time.time()))
                test.set(f"test/applied/{rank}/{v}", "1")
                if v >= opts["last"]:
                    break
        except StoreUnreachable as exc:
            keep = layout_mismatches(layout, tensors, canonical(r, served)) if served is not None else None
            events.append(("store-error", exc.restarted, str(exc), time.time(), served, keep))
            bridge.close()
            bridge = build()
        except TornModelError as exc:
            events.append(("torn", str(exc), time.time()))
        except TYPED as exc:
            events.append(("error", type(exc).__name__, str(exc), time.time(), bridge.torn))
            test.add(f"test/errors/{rank}", 1)
            if bridge.torn:
                try:
                    bridge.apply()
                except TornModelError:
                    pass
        time.sleep(0.002)
    events.append(("final", served, time.time()))
    bridge.close()
    return events


def main(role: str, spec: str, rank: int, port: int, test_port: int, opts: dict) -> list[tuple]:
    return (trainer if role == "trainer" else rollout)(spec, rank, port, test_port, opts)
