"""Process bodies for the multiprocess bridge tests (run through ``weightbridge.localrun.launch``).

Each returns a list of plain events (tuples) the test asserts on. The parent hosts the
TCPStore (port 0, no race) so that killing trainer 0 never takes the store down with it.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import BridgeError, TornModelError
from weightbridge.tensors import layout_mismatches
from weightbridge.tensors import materialize, torch_dtype
from weightbridge.testing._internal.cuda_standin import StatedIdentityPlane
from weightbridge.transport.errors import TransportError
from weightbridge.transport.identity import host_identity
from weightbridge.transport.store import open_store

HOST = "127.0.0.1"
TYPED = (BridgeError, TransportError)


def _options(opts: dict, on_round) -> BridgeOptions:
    plane = StatedIdentityPlane(opts["identity"]) if opts.get("identity") else None
    return BridgeOptions(on_round=on_round, data_plane=plane)


def _identities(bridge) -> tuple:
    """("identity", every member's identity as its hello stated it, this process's host identity)."""
    return ("identity", {str(k): h.identity.model_dump() if h.identity else None for k, h in bridge.hellos.items()},
            host_identity())


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def _store(port: int, timeout_s: float):
    return open_store(HOST, port, is_master=False, timeout_s=timeout_s)


def trainer(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """Push ``opts['versions']``; ``opts['kill']`` = (version, round): SIGKILL self after that round.

    ``opts['after_kill']``: wait for the test's ``killed_at`` key first (a restarted process).
    ``opts['dtype']``: build local tensors in this dtype (a dtype mismatch).
    """
    r = load_spec(spec)
    store = _store(port, r.sync.timeout_s)
    if opts.get("after_kill"):
        while not store.check(["test/killed_at"]):
            time.sleep(0.01)
    for rr in range(opts.get("await_rollouts", 0)):  # e.g. so that a min_instances=1 push 1 finds all
        while not store.check([f"wb/join/rollout/{rr}"]):
            time.sleep(0.01)
    layout = r.trainer.ranks[rank]
    tensors = materialize(layout, canonical(r, 0))
    if opts.get("dtype"):
        tensors = {k: v.to(torch_dtype(opts["dtype"])) for k, v in tensors.items()}
    current = {"v": None}
    kill = opts.get("kill")

    def on_round(index: int) -> None:
        if kill is not None and current["v"] == kill[0] and index >= kill[1]:
            store.set("test/killed_at", str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    events: list[tuple] = []
    try:
        bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, store=store, options=_options(opts, on_round))
    except TYPED as exc:
        return [("error", None, type(exc).__name__, str(exc), time.time())]
    for v in opts["versions"]:
        fresh = materialize(layout, canonical(r, v))
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(fresh[name])
        current["v"] = v
        if opts.get("wait_key") and v == opts["wait_key"][0]:
            while not store.check([opts["wait_key"][1]]):
                time.sleep(0.01)
        t0 = time.time()
        try:
            s = bridge.push(v)
            events.append(("pushed", v, s.epoch, s.seq, s.bytes_sent, s.seconds, s.wait_s, time.time()))
        except TYPED as exc:
            events.append(("error", v, type(exc).__name__, str(exc), time.time(), time.time() - t0))
            if opts.get("stop_on_error", True):
                break
        store.set(f"test/pushed/{rank}/{v}", "1")
    store.set(f"test/trainer-done/{rank}", "1")
    bridge.close()
    return events


def rollout(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """Poll/apply until ``opts['last']`` is applied or ``opts['run_s']`` passes; verify bitwise.

    ``opts['staging']``: staging or in place; ``opts['kill']`` = (version, round): SIGKILL self
    after that round of that version's receive; ``opts['start_key']``: wait for it first
    (a late joiner); ``opts['apply_every']``: apply only every n-th poll cycle (a slow engine).
    """
    r = load_spec(spec)
    store = _store(port, r.sync.timeout_s)
    if opts.get("start_key"):
        while not store.check([opts["start_key"]]):
            time.sleep(0.01)
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, canonical(r, -1), fill=7.0)
    if opts.get("dtype"):
        tensors = {k: v.to(torch_dtype(opts["dtype"])) for k, v in tensors.items()}
    kill = opts.get("kill")

    def on_round(index: int) -> None:
        if kill is not None and index >= kill[1]:
            ann = store.get("wb/ann")
            if f'"version":{kill[0]}' in ann.decode(errors="replace"):  # MAC || JSON
                store.set("test/killed_at", str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

    events: list[tuple] = []
    try:
        bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, store=store, staging=opts.get("staging", True),
                                         options=_options(opts, on_round))
    except TYPED as exc:
        return [("error", None, type(exc).__name__, str(exc), time.time())]
    deadline = time.monotonic() + opts.get("run_s", 20)
    last = opts["last"]
    done_at = None
    while time.monotonic() < deadline:
        if done_at is None and store.check(["test/trainer-done/0"]):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > 0.5 and not bridge.ready():
            break  # trainer 0 finished a while ago and nothing is left to apply
        try:
            if bridge.poll():
                before = bridge.version
                v = bridge.apply()
                bad = layout_mismatches(layout, tensors, canonical(r, v))
                events.append(("applied", v, before, bad, time.time()))
                if v >= last:
                    break
        except TornModelError as exc:
            events.append(("torn-apply", type(exc).__name__, str(exc), time.time()))
        except TYPED as exc:
            v = bridge.version
            keep = layout_mismatches(layout, tensors, canonical(r, v)) if v is not None else None
            events.append(("error", type(exc).__name__, str(exc), time.time(), bridge.torn, v, keep))
            if bridge.torn:
                try:
                    bridge.apply()
                except TornModelError as exc2:
                    events.append(("torn-apply", type(exc2).__name__, str(exc2), time.time()))
            if opts.get("stop_on_error"):
                break
        time.sleep(0.002)
    if opts.get("identities"):
        events.append(_identities(bridge))
    events.append(("final", bridge.version, bridge.torn, time.time()))
    bridge.close()
    return events


def main(role: str, spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    return (trainer if role == "trainer" else rollout)(spec, rank, port, opts)
