"""Bridges across hosts (network namespaces, shaped links): bitwise delivery, a throttled link, a cut link.

Four hosts on one machine (``weightbridge/testing/_internal/cluster.py``): trainer ranks (FSDP2 dp 2)
on host 0, rollout instances 0 and 1 on host 1, instances 2 and 3 on host 2 (receiver
de-replication on: each host takes every byte once and forwards it to its other instance over
loopback); the control store on trainer 0's host (sync) or an external ``weightbridge store`` on
host 3 (async). One run per mode:

* push 1: bitwise on every rollout rank;
* push 2: host 2's link throttled to a tenth of its rate: still delivered, bitwise;
* push 3: host 2's link cut after the first round: every trainer raises a typed error naming
  host 2's ranks (rollout 2 and 3) within ``timeout_s + 2 s`` of the cut; no rollout rank ever
  applies a torn or wrong model (every apply is checked bitwise, in place a torn model refuses
  ``apply()``; staged, the live weights keep the last version);
* push 4, after the link is back: every rollout rank applies it, bitwise (the cut healed).

Skips where namespaces cannot be made (not root, no ``ip``/``tc``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import multihost_workers as W
from weightbridge.testing._internal.cluster import Cluster, Link, ours, require

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
require()  # skips without root, ip or tc (fails instead under WEIGHTBRIDGE_REQUIRE_NETNS=1)

TIMEOUT_S = 4.0
PORT = 29400
HOSTS = {"trainer": [0, 0], "rollout": [1, 1, 2, 2]}  # host of each rank (rollout rank = instance)


def spec_text(mode: str, store: str) -> str:
    return (
        "version: 1\nmodel: {bundled: tiny-qwen2}\n"
        "trainer: {preset: fsdp2, mesh: {dp: 2}}\n"
        "rollout: {preset: vllm, instances: 4, mesh: {tp: 1}}\n"
        f"sync: {{mode: {mode}, timeout_s: {TIMEOUT_S}, heartbeat_s: 0.2, round_bytes: 16KiB, store: {store},"
        " receiver_dedup: on}\n"
        "network: {preset: cpu-gloo, nic_gbit_per_s: 1, nics_per_node: 1,"
        " hosts: [{trainer: 2}, {rollout: 2}, {rollout: 2}, {}]}\n"
    )


def run_faults(tmp: Path, mode: str) -> tuple[list, list, float]:
    """The four pushes of the module docstring; returns (trainer events, rollout events, cut time)."""
    external = mode == "async"
    text = spec_text(mode, "external" if external else "trainer0")
    opts = {"dir": str(tmp), "versions": [1, 2, 3, 4], "cut": 3, "wait_go": [2, 4], "last": 4, "run_s": 90}
    with Cluster(4, link=Link(gbit=1.0)) as c:
        host, port = c.start_store(3, PORT) if external else (c.address(0), PORT)
        placed = [(HOSTS[side][rank], (side, text, rank, host, port, opts))
                  for side in ("trainer", "rollout") for rank in range(len(HOSTS[side]))]
        results: list = []
        runner = threading.Thread(target=lambda: results.extend(c.launch(W.main, placed, timeout_s=150)))
        runner.start()
        try:
            assert W.wait_file(tmp / "pushed-0-1", 60), "push 1 never ended"
            c.set_rate(2, 0.1)  # push 2 on a link at a tenth of its rate
            (tmp / "go-2").write_text("1")
            assert W.wait_file(tmp / "pushed-0-2", 60) and W.wait_file(tmp / "pushed-1-2", 60)
            c.set_rate(2, 1.0)
            assert W.wait_file(tmp / "cut-request", 60), "push 3 never reached its first round"
            c.cut(2)
            cut_at = time.time()
            (tmp / "cut-done").write_text("1")
            assert W.wait_file(tmp / "pushed-0-3", 60) and W.wait_file(tmp / "pushed-1-3", 60)
            c.restore(2)
            (tmp / "go-4").write_text("1")
        finally:
            runner.join(180)
    assert not runner.is_alive()
    assert not [ns for ns in ours() if ns.startswith(c.name)], "namespaces left behind"
    for x in results:
        assert x.ok, (x.error, x.traceback, x.timed_out, x.exitcode)
    values = [x.value for x in results]
    return values[:2], values[2:], cut_at


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_throttled_link_delivers_and_a_cut_fails_typed_then_heals(tmp_path, mode):
    trainers, rollouts, cut_at = run_faults(tmp_path, mode)
    for t in trainers:
        kinds = [(e[0], e[1]) for e in t]
        assert kinds == [("pushed", 1), ("pushed", 2), ("error", 3), ("pushed", 4)], t
        _, _, etype, message, failed_at, _ = t[2]
        assert etype in ("PeerTimeout", "PeerFailed", "PeerDisconnected", "DeadlineExceeded"), t[2]
        assert "rollout 2" in message and "rollout 3" in message, message  # host 2's ranks, both
        assert failed_at - cut_at < TIMEOUT_S + 2.0, (failed_at - cut_at, message)
    for rank, events in enumerate(rollouts):
        assert ("forwards", True) in events, events  # the host's other instance got bytes over loopback
        applied = [e for e in events if e[0] == "applied"]
        assert all(e[2] == [] for e in applied), (rank, applied)  # every model ever made live is exact
        assert [e[1] for e in applied][:2] == [1, 2] and applied[-1][1] == 4, (rank, events)
        final = events[-1]
        assert final[:3] == ("final", 4, False) and final[3] == [], (rank, final)
        if HOSTS["rollout"][rank] == 2:  # the cut host's ranks never applied version 3
            assert 3 not in [e[1] for e in applied], (rank, events)
