"""A link cut between the trainer's host and a rollout's host: every side raises within one deadline.

Issue 26: with ``timeout_s`` 6, async rollouts raised 13-14 s after a link cut (the data plane's
deadline, then another on a store they could no longer reach). Two network namespaces joined by a
veth pair (``docs``: ``/work/shared/background/RECIPES.md`` style; root only, as CI runs): trainer 0
hosts the control store on its side; the test cuts the link (``ip link set ... down``) in the middle
of push 2. Real Gloo, real processes.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time

import pytest

from weightbridge.localrun import launch

import sync_linkcut_workers as W

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT_S = 4.0
SLACK_S = 2.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"wbprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
        _ip("netns", "del", name)
        return True
    except (subprocess.SubprocessError, OSError):
        return False


@pytest.fixture
def two_hosts():
    """Namespaces "trainer host" and "rollout host", one veth link; deleted afterwards, also on failure."""
    if not _netns_usable():
        pytest.skip("needs root and network namespaces (ip netns add), as CI runs")
    tag = f"{os.getpid() % 10000}"
    ns, ifs = (f"wbt{tag}", f"wbr{tag}"), (f"vt{tag}", f"vr{tag}")
    net = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
    ips = (f"{net}.1", f"{net}.2")
    try:
        for n in ns:
            _ip("netns", "add", n)
            _ip("-n", n, "link", "set", "lo", "up")
        _ip("link", "add", ifs[0], "netns", ns[0], "type", "veth", "peer", "name", ifs[1], "netns", ns[1])
        for n, i, a in zip(ns, ifs, ips):
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", i)
            _ip("-n", n, "link", "set", i, "up")
        yield {"ns": ns, "if": ifs, "ip": ips}
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=10)


def test_after_a_link_cut_mid_push_the_trainer_and_the_async_rollout_raise_within_one_deadline(two_hosts, tmp_path):
    cfg = {**two_hosts, "work": str(tmp_path), "timeout_s": TIMEOUT_S, "port": random.randrange(20000, 60000),
           "run_s": 6 * TIMEOUT_S + 20}
    cut: list[float] = []

    def cutter() -> None:
        end = time.monotonic() + 60
        while not (tmp_path / "cut-now").exists() and time.monotonic() < end:
            time.sleep(0.005)
        if (tmp_path / "cut-now").exists():
            _ip("-n", cfg["ns"][1], "link", "set", cfg["if"][1], "down")
            cut.append(time.time())
        (tmp_path / "cut").touch()

    import threading

    thread = threading.Thread(target=cutter, daemon=True)
    thread.start()
    res = launch(W.main_of, [(W.trainer, cfg), (W.rollout, cfg)], timeout_s=10 * TIMEOUT_S + 60)
    thread.join(5)
    assert all(r.ok and not r.timed_out for r in res), [(r.exitcode, r.error) for r in res]
    trainer, rollout = (r.value for r in res)
    assert cut, "push 2 never reached its second round"
    assert [e["v"] for e in trainer if e["kind"] == "pushed"] == [1]
    assert [e["v"] for e in rollout if e["kind"] == "applied"] == [1]
    for name, events in (("trainer 0", trainer), ("rollout 0", rollout)):
        errors = [e for e in events if e["kind"] == "error" and e["t"] >= cut[0]]
        assert errors and all(e["typed"] for e in errors), (name, events)
        late = errors[0]["t"] - cut[0]
        print(f"{name}: {errors[0]['type']} {late:.2f}s after the cut (timeout_s {TIMEOUT_S:g})")
        assert late <= TIMEOUT_S + SLACK_S, f"{name} raised {late:.1f}s after the cut: {errors[0]}"
