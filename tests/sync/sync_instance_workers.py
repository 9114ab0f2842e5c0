"""Process bodies for the instance-apply and rank-naming tests over Gloo (run through ``launch``).

One trainer rank and the two ranks of rollout instance 1 (spec ranks 2 and 3) of a spec with two
instances: instance 0 never joins, so the epoch's plan numbers rollout 2 and 3 as plan ranks 0 and 1
(bridge ranks 1 and 2). Errors must still name them ``rollout 2`` / ``rollout 3``.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge
from weightbridge.errors import BridgeError
from weightbridge.spec.resolve import load_spec  # noqa: F401 - the tests read specs through W
from weightbridge.tensors import layout_mismatches
from weightbridge.transport.errors import TransportError
from weightbridge.tensors import materialize, torch_dtype
from weightbridge.transport.store import open_store

HOST = "127.0.0.1"
TYPED = (BridgeError, TransportError)


def spec(mode: str = "async", round_bytes: str = "64KiB", timeout_s: float = 20.0, dedup: str = "auto",
         transport: str = "gloo") -> str:
    """Instance 0 never joins: every push waits for one instance (``min_instances: 1``)."""
    return (
        "version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2, mesh: {dp: 1}}\n"
        "rollout: {preset: vllm, instances: 2, mesh: {tp: 2}}\n"
        f"sync: {{mode: {mode}, max_staleness: 1, round_bytes: {round_bytes}, timeout_s: {timeout_s}, "
        f"heartbeat_s: 0.2, min_instances: 1, receiver_dedup: {dedup}, transport: {transport}}}\n"
    )


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def trainer(text: str, port: int, opts: dict) -> list[tuple]:
    r = load_spec(text)
    store = open_store(HOST, port, is_master=False, timeout_s=r.sync.timeout_s)
    tensors = materialize(r.trainer.ranks[0], canonical(r, 0))
    events: list[tuple] = []
    bridge = TrainerBridge.from_spec(r, rank=0, tensors=tensors, store=store)
    try:
        for v in opts["versions"]:
            fresh = materialize(r.trainer.ranks[0], canonical(r, v))
            with torch.no_grad():
                for name, t in tensors.items():
                    t.copy_(fresh[name])
            try:
                s = bridge.push(v)
                events.append(("pushed", v, s.epoch))
            except TYPED as exc:
                events.append(("error", v, type(exc).__name__, str(exc)))
                if not opts.get("go_on"):  # else the next version heals what this one left
                    break
        while opts.get("linger_key") and not store.check([opts["linger_key"]]):
            time.sleep(0.01)
    finally:
        bridge.close()
    return events


def rollout(text: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """``opts['slow']`` = (version, seconds): sleep in round 0 of that version's receive (stages late);
    ``opts['kill']`` = version: SIGKILL self in round 0 of it; ``opts['poll_s']``: first poll()/apply()
    for that long (until one version is applied); ``opts['wants']``: then the ``apply_instance`` calls
    to make, each ``(version, timeout_s)``, after ``opts['delay_s']`` (and, with ``opts['after_push']``,
    once a push is announced). ``opts['stream']``: no live
    tensors (``tensors=None``): each local tensor streams into a sink that records it (CPU copies), the
    "engine"; every want then records ``("state", want, torn, version, tensors streamed)``."""
    r = load_spec(text)
    store = open_store(HOST, port, is_master=False, timeout_s=r.sync.timeout_s)
    layout = r.rollout.ranks[rank]
    stream = opts.get("stream", False)
    tensors = {} if stream else materialize(layout, canonical(r, -1), fill=7.0)
    streamed = [0]

    def sink(name: str, t: torch.Tensor) -> None:
        tensors[name] = t.detach().to("cpu", copy=True)
        streamed[0] += 1
    current: dict = {"v": None, "rounds": []}
    slow, kill = opts.get("slow"), opts.get("kill")

    def on_round(index: int) -> None:
        ann = store.get("wb/ann").decode(errors="replace")  # MAC || JSON
        if kill is not None and f'"version":{kill}' in ann:
            os.kill(os.getpid(), signal.SIGKILL)
        if slow is not None and index == 0 and f'"version":{slow[0]},' in ann:
            time.sleep(slow[1])
        current["rounds"].append(time.time())

    bridge = RolloutBridge.from_spec(r, rank=rank, tensors=None if stream else tensors, store=store,
                                     staging=opts.get("staging", True), options=BridgeOptions(on_round=on_round))
    events: list[tuple] = []
    try:
        deadline = time.monotonic() + opts.get("poll_s", 0)
        while time.monotonic() < deadline:  # rank-level poll()/apply() (no instance agreement)
            try:
                if bridge.poll():
                    events.append(("applied", None, bridge.apply(), time.time(), None))
                    break
            except TYPED as exc:
                events.append(("error", None, type(exc).__name__, str(exc), 0.0, bridge.version))
                break
            time.sleep(0.002)
        time.sleep(opts.get("delay_s", 0.0))
        while opts.get("after_push") and not store.check(["wb/ann"]):  # the first push is announced
            time.sleep(0.01)
        for want, timeout_s in opts.get("wants", ()):
            t0 = time.time()
            streamed[0] = 0
            try:
                v = bridge.apply_instance(want, timeout_s=timeout_s, sink=sink if stream else None)
                bad = layout_mismatches(layout, tensors, canonical(r, v)) if v is not None else None
                events.append(("applied", want, v, time.time(), bad))
            except TYPED as exc:
                events.append(("error", want, type(exc).__name__, str(exc), time.time() - t0, bridge.version))
            if stream:
                events.append(("state", want, bridge.torn, bridge.version, streamed[0], bridge.memory()))
        events.append(("rounds", current["rounds"]))
        store.set(f"test/done/{rank}", "1")
        for other in opts.get("wait_for", ()):  # keep heart-beating until the peers are done
            while not store.check([f"test/done/{other}"]):
                time.sleep(0.01)
    finally:
        bridge.close()
    return events


def main(role: str, text: str, rank: int, port: int, opts: dict) -> list[tuple]:
    if role == "trainer":
        return trainer(text, port, opts)
    return rollout(text, rank, port, opts)
