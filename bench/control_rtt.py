#!/usr/bin/env python
"""Benchmark: sequential control-store round trips per push, sync and async.

Two trainer ranks (FSDP2 dp 2) push to four rollout instances (TP1) of a tiny model through real
bridges (Gloo over loopback), the control store hosted by this process (``sync.store: external``).
Each mode runs twice: ranks talking to the store directly, and through a relay that delays every
byte by ``--delay-ms`` each way (``testing/_internal/delay_proxy.py``; the data plane stays direct).
The bytes move in milliseconds, so what a push gains with the delay is its control plane:

    sequential round trips per push = (push time with delay - without) / (2 x delay)

(median over the pushes after the first; the first also builds the epoch and is shown apart). It
also prints how many store calls trainer 0 and a rollout rank make per push (every thread).

    python bench/control_rtt.py                  # 50 ms each way, 5 pushes per mode
    python bench/control_rtt.py --delay-ms 200   # the issue's setting (~11 s per async push before)
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import threading
import time

from weightbridge.bridge import RolloutBridge, TrainerBridge, load_spec
from weightbridge.tensors import materialize
from weightbridge.testing._internal.delay_proxy import DelayProxy
from weightbridge.localrun import launch
from weightbridge.transport.store import open_store

TRAINERS, INSTANCES = 2, 4


def spec_text(mode: str, timeout_s: float) -> str:
    return (
        "version: 1\nmodel: {bundled: tiny-qwen2}\n"
        f"trainer: {{preset: fsdp2, mesh: {{dp: {TRAINERS}}}}}\n"
        f"rollout: {{preset: vllm, instances: {INSTANCES}, mesh: {{tp: 1}}}}\n"
        f"sync: {{mode: {mode}, timeout_s: {timeout_s}, store: external}}\nnetwork: cpu-gloo\n"
    )


def _count_calls() -> collections.Counter:
    """Count every store call of this process (by thread kind and call) from now on."""
    from weightbridge.transport import store_client

    counts: collections.Counter = collections.Counter()
    real = store_client.ReconnectingStore._call

    def counted(self, name, *args, **kw):
        thread = threading.current_thread().name
        counts[("heartbeat" if "heartbeat" in thread else "main" if thread == "MainThread" else "receive", name)] += 1
        return real(self, name, *args, **kw)

    store_client.ReconnectingStore._call = counted
    return counts


def worker(role: str, spec: str, rank: int, port: int, pushes: int) -> dict:
    import torch

    r = load_spec(spec)
    counts = _count_calls()
    if role == "trainer":
        layout = r.trainer.ranks[rank]
        tensors = materialize(layout, {t.name: torch.zeros(t.shape) for t in r.canonical.tensors})
        bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, host="127.0.0.1", port=port)
        out = {"seconds": [], "calls": []}
        for v in range(1, pushes + 1):
            before = collections.Counter(counts)
            t0 = time.perf_counter()
            bridge.push(v)
            out["seconds"].append(time.perf_counter() - t0)
            out["calls"].append(_diff(counts, before))
        bridge.close()
        return out
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, {t.name: torch.zeros(t.shape) for t in r.canonical.tensors})
    bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, host="127.0.0.1", port=port)
    out = {"calls": []}
    before = collections.Counter(counts)
    deadline = time.monotonic() + 60 + pushes * 30
    while time.monotonic() < deadline:
        if bridge.poll():
            v = bridge.apply()
            out["calls"].append(_diff(counts, before))
            before = collections.Counter(counts)
            if v >= pushes:
                break
        time.sleep(0.001)
    time.sleep(1.0)  # trainer 0 reads the last acks
    bridge.close()
    return out


def _diff(now: collections.Counter, before: collections.Counter) -> dict:
    out: dict = {}
    for (thread, name), n in (now - before).items():
        out.setdefault(thread, {})[name] = n
    return out


def run(mode: str, delay_s: float, pushes: int, timeout_s: float) -> dict:
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    proxy = DelayProxy(("127.0.0.1", store.port), delay_s) if delay_s > 0 else None
    port = proxy.port if proxy else store.port
    text = spec_text(mode, timeout_s)
    procs = [("trainer", text, t, port, pushes) for t in range(TRAINERS)]
    procs += [("rollout", text, q, port, pushes) for q in range(INSTANCES)]
    try:
        res = launch(worker, procs, timeout_s=60 + pushes * (timeout_s + 10))
    finally:
        if proxy:
            proxy.close()
    for x in res:
        if not x.ok:
            raise SystemExit(f"{mode} delay {delay_s}: process {x.index} failed: {x.traceback or x}")
    t0, roll = res[0].value, res[TRAINERS].value
    return {"seconds": t0["seconds"], "trainer0_calls": t0["calls"], "rollout0_calls": roll["calls"]}


def _total(calls: dict, threads=("main", "receive")) -> int:
    return sum(n for t in threads for n in calls.get(t, {}).values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, default=50.0, help="added to every store byte, each way")
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0, help="sync.timeout_s")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    d = args.delay_ms / 1000
    report = {}
    for mode in ("sync", "async"):
        base, slow = run(mode, 0.0, args.pushes, args.timeout), run(mode, d, args.pushes, args.timeout)
        steady = statistics.median(slow["seconds"][1:]) - statistics.median(base["seconds"][1:])
        report[mode] = {
            "push_s": statistics.median(base["seconds"][1:]), "push_s_delayed": statistics.median(slow["seconds"][1:]),
            "first_push_s": base["seconds"][0], "first_push_s_delayed": slow["seconds"][0],
            "round_trips_per_push": steady / (2 * d),
            "round_trips_first_push": (slow["seconds"][0] - base["seconds"][0]) / (2 * d),
            "trainer0_store_calls_per_push": statistics.median(_total(c) for c in base["trainer0_calls"][1:]),
            "rollout0_store_calls_per_push": statistics.median(_total(c) for c in base["rollout0_calls"][1:]),
            "trainer0_calls_last_push": base["trainer0_calls"][-1],
        }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{TRAINERS} trainer ranks -> {INSTANCES} rollout instances, tiny model; store relay +{args.delay_ms:g} ms "
              f"each way; median of pushes 2..{args.pushes}")
        print(f"{'mode':<7}{'push s':>8}{'delayed':>9}{'round trips/push':>18}{'first push':>12}"
              f"{'T0 calls':>10}{'rollout calls':>15}")
        for mode, m in report.items():
            print(f"{mode:<7}{m['push_s']:>8.3f}{m['push_s_delayed']:>9.3f}{m['round_trips_per_push']:>18.1f}"
                  f"{m['round_trips_first_push']:>12.1f}{m['trainer0_store_calls_per_push']:>10.0f}"
                  f"{m['rollout0_store_calls_per_push']:>15.0f}")
    print("sequential store round trips per push: " + "; ".join(
        f"{mode} {m['round_trips_per_push']:.1f}" for mode, m in report.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
