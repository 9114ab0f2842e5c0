"""The cluster harness leaves nothing behind: no namespace, no link, no process, also after a failure.

Everything the harness creates lives in namespaces it creates (the machine's own namespace gets no
link); :meth:`Cluster.down` kills what runs inside them and deletes them, within a bounded time,
whether the run ended normally, raised, or left a process hanging past its deadline; namespaces of
a run killed with SIGKILL (no cleanup ran) are removed by the next cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import multihost_workers as W
from weightbridge.testing._internal import cluster as C
from weightbridge.testing._internal.cluster import Cluster, ours, require

pytestmark = [pytest.mark.multiprocess]
require()  # skips without root, ip or tc (fails instead under WEIGHTBRIDGE_REQUIRE_NETNS=1)


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def test_down_after_a_failure_and_a_hanging_process_leaves_nothing():
    links = root_links()
    stray = None
    t0 = None
    with pytest.raises(RuntimeError, match="the test's own failure"):
        with Cluster(3) as c:
            mine = [ns for ns in ours() if ns.startswith(c.name)]
            assert len(mine) == 4  # three hosts and the switch
            assert root_links() == links  # every link is inside the cluster's namespaces
            res = c.launch(W.hang, [(0, (30.0,)), (1, (0.0,))], timeout_s=3)
            assert res[0].timed_out and res[1].ok and res[1].value == c.address(1)
            # a process the harness did not start itself, inside a host: down() must find it too
            stray = subprocess.Popen(["ip", "netns", "exec", c.netns(2), sys.executable, "-c",
                                      "import time; time.sleep(600)"])
            deadline = time.monotonic() + 10
            while stray.pid not in c.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert stray.pid in c.pids()
            t0 = time.monotonic()
            raise RuntimeError("the test's own failure")
    assert time.monotonic() - t0 < 30
    assert stray.wait(10) == -9  # killed by down()
    assert not [ns for ns in ours() if ns.startswith(c.name)]
    assert root_links() == links
    c.down()  # idempotent


def test_namespaces_of_a_killed_run_are_swept_by_the_next_cluster(monkeypatch):
    """Only a dead creator's namespaces with nothing inside go: not a live run's, not one still in use."""
    monkeypatch.setattr(C, "STALE_S", -1.0)  # age is the third condition (a reused pid's fresh namespaces)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone, used, running = f"{C.PREFIX}{dead.pid}-1-h0", f"{C.PREFIX}{dead.pid}-1-h1", f"{C.PREFIX}{live.pid}-1-h0"
    inside = None
    try:
        for ns in (gone, used, running):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        inside = subprocess.Popen(["ip", "netns", "exec", used, sys.executable, "-c", "import time; time.sleep(60)"])
        deadline = time.monotonic() + 10
        while not subprocess.run(["ip", "netns", "pids", used], capture_output=True, text=True).stdout.split():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert C.sweep_stale() == [gone]
        assert gone not in ours() and used in ours() and running in ours()
    finally:
        for proc in (live, inside):
            if proc is not None:
                proc.kill()
                proc.wait(10)
        for ns in (gone, used, running):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_without_namespaces_tests_skip_with_the_reason_and_fail_under_require(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert C._probe() == "network namespaces need root (running as uid 1000)"
    monkeypatch.setattr(C, "_UNAVAILABLE", ["iproute2's tc not found (install iproute2)"])
    monkeypatch.delenv(C.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="tc not found"):
        C.require()
    monkeypatch.setenv(C.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="WEIGHTBRIDGE_REQUIRE_NETNS=1 but .*tc not found"):
        C.require()
