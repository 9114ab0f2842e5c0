"""Rank bodies for test_link_cut_mp.py: a trainer and a rollout "host" each in its own network namespace.

The parent creates the namespaces and the veth link between them, and cuts the link when the trainer
marks that push 2 is under way (a file in the shared work directory: the parent cannot reach the
namespaces' addresses). Each body returns its events (``time.time()``); exceptions are events.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sync_harness import canonical, set_weights, spec_text

CLONE_NEWNET = 0x40000000


def enter(netns: str, ifname: str) -> None:
    """Move this process into network namespace ``netns`` (as ``ip netns exec`` does); Gloo uses ``ifname``."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns})")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname


def spec(cfg: dict):
    from weightbridge.bridge import load_spec

    return load_spec(spec_text(mode="async", timeout_s=cfg["timeout_s"], heartbeat_s=0.2,
                               trainer="{preset: fsdp2, mesh: {dp: 1}}",
                               rollout="{preset: vllm, instances: 1, mesh: {tp: 1}}", store="trainer0"))


def error(exc: BaseException, **kw) -> dict:
    from weightbridge.errors import BridgeError

    return {"kind": "error", "type": type(exc).__name__, "typed": isinstance(exc, BridgeError),
            "msg": str(exc)[:300], "t": time.time(), **kw}


def trainer(cfg: dict) -> list[dict]:
    """Push 1, then push 2, pausing after its first round until the parent cut the link."""
    from weightbridge.bridge import BridgeOptions, TrainerBridge
    from weightbridge.tensors import materialize

    enter(cfg["ns"][0], cfg["if"][0])
    work, r = Path(cfg["work"]), spec(cfg)
    tensors = materialize(r.trainer.ranks[0], canonical(r, 1))
    current = {"v": 1}

    def on_round(index: int) -> None:
        if current["v"] == 2 and index >= 1 and not (work / "cut").exists():
            (work / "cut-now").touch()
            end = time.monotonic() + 10
            while not (work / "cut").exists() and time.monotonic() < end:
                time.sleep(0.005)

    events: list[dict] = []
    bridge = TrainerBridge.from_spec(r, rank=0, tensors=tensors, host=cfg["ip"][0], port=cfg["port"],
                                     options=BridgeOptions(on_round=on_round))
    for v in (1, 2):
        current["v"] = v
        set_weights(r.trainer.ranks[0], tensors, canonical(r, v))
        try:
            bridge.push(v)
            events.append({"kind": "pushed", "v": v, "t": time.time()})
        except BaseException as exc:  # noqa: BLE001 - reported
            events.append(error(exc, v=v))
        if v == 1:
            end = time.monotonic() + 30
            while not (work / "applied-1").exists() and time.monotonic() < end:
                time.sleep(0.01)
    (work / "trainer-done").touch()
    bridge.close()
    return events


def rollout(cfg: dict) -> list[dict]:
    """The engine loop (poll, apply) until the trainer is done or the run's time is up."""
    from weightbridge.bridge import RolloutBridge
    from weightbridge.tensors import materialize

    enter(cfg["ns"][1], cfg["if"][1])
    work, r = Path(cfg["work"]), spec(cfg)
    tensors = materialize(r.rollout.ranks[0], canonical(r, -1), fill=7.0)
    events: list[dict] = []
    bridge = RolloutBridge.from_spec(r, rank=0, tensors=tensors, host=cfg["ip"][0], port=cfg["port"], staging=True)
    end = time.monotonic() + cfg["run_s"]
    while time.monotonic() < end and not (work / "trainer-done").exists():
        try:
            if bridge.poll():
                v = bridge.apply()
                events.append({"kind": "applied", "v": v, "t": time.time()})
                (work / f"applied-{v}").touch()
        except BaseException as exc:  # noqa: BLE001 - reported
            events.append(error(exc))
            if len([e for e in events if e["kind"] == "error"]) > 3:
                break
        time.sleep(0.005)
    try:
        bridge.close()
    except BaseException:  # noqa: BLE001 - the store is out of reach: closing may fail, typed
        pass
    return events


def main_of(fn, cfg: dict) -> list[dict]:
    """``launch`` target: run one of the bodies above."""
    return fn(cfg)
