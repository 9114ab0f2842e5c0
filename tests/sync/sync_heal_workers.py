"""Process bodies for ``test_heal_mp.py`` (run through ``weightbridge.localrun.launch``): a rollout rank
that applies slowly or damages what it receives. Trainers are ``sync_mp_workers.trainer``."""

from __future__ import annotations

import time

from weightbridge.bridge import BridgeOptions, RolloutBridge, load_spec
from weightbridge.errors import BridgeError, TornModelError
from weightbridge.tensors import layout_mismatches
from weightbridge.tensors import materialize

import sync_mp_workers as W


def _damage_checksums_of(bridge_ref: list, version: int) -> None:
    """Make this process's checksum check see damaged bytes in every bucket of ``version``
    (as if the wire flipped bits): the receiver raises a genuine ``ChecksumError``."""
    from weightbridge.transport import pipeline

    real = pipeline.read_trailer

    def read_trailer(buf, n):
        ann = bridge_ref[0].board.announcement() if bridge_ref else None
        want = real(buf, n)
        return want ^ 1 if ann is not None and ann.version == version else want

    pipeline.read_trailer = read_trailer


def rollout(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """Poll/apply until ``opts['last']`` is applied or ``opts['run_s']`` passes; verify bitwise.

    ``opts['slow_apply']``: {version: seconds} to wait before applying that version (a slow
    engine); ``opts['damage']``: a version whose received bytes fail their checksum here.
    """
    r = load_spec(spec)
    store = W._store(port, r.sync.timeout_s)
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, W.canonical(r, -1), fill=7.0)
    ref: list = []
    if opts.get("damage") is not None:
        _damage_checksums_of(ref, opts["damage"])
    events: list[tuple] = []
    bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, store=store, staging=opts.get("staging", True),
                                     options=BridgeOptions())
    ref.append(bridge)
    slow = {int(k): v for k, v in opts.get("slow_apply", {}).items()}
    deadline = time.monotonic() + opts.get("run_s", 30)
    while time.monotonic() < deadline:
        try:
            if bridge.poll():
                time.sleep(slow.pop(bridge.staged_version, 0.0))
                v = bridge.apply()
                events.append(("applied", v, layout_mismatches(layout, tensors, W.canonical(r, v)), time.time()))
                if v >= opts["last"]:
                    break
        except TornModelError as exc:
            events.append(("torn-apply", type(exc).__name__, str(exc), time.time()))
        except BridgeError as exc:
            events.append(("error", type(exc).__name__, str(exc), time.time(), bridge.torn))
        time.sleep(0.002)
    events.append(("final", bridge.version, bridge.torn, time.time()))
    bridge.close()
    return events


def main(role: str, spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    return (W.trainer if role == "trainer" else rollout)(spec, rank, port, opts)
