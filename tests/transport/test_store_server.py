"""The bounded control store (transport/store_server.py) against torch's own TCPStore client, and the
deadline-bounded client (transport/store_wire.py).

The server runs as it does for trainer rank 0 and ``open_store(is_master=True)``: a child process
(``spawn``); the clients are torch's ``TCPStore`` (what Gloo's rendezvous and users hold).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from weightbridge.sync.auth import Signer
from weightbridge.transport.store import listen_socket, open_store
from weightbridge.transport.store_host import spawn
from weightbridge.transport.store_server import STORE_ID_KEY, Limits
from weightbridge.transport.store_wire import StoreConnection, StoreConnectionLost

HOST = "127.0.0.1"
SECRET = b"store-server-test-secret-0123456789"


@pytest.fixture
def serve():
    """``serve(secret=..., limits=...)`` -> port of a bounded store in a child process (stopped afterwards)."""
    procs = []

    def start(secret=None, limits=Limits()):
        listener = socket.socket(fileno=listen_socket(HOST, 0))
        port = listener.getsockname()[1]
        procs.append(spawn(listener, secret=secret, limits=limits))
        return port

    yield start
    for proc in procs:
        proc.stdin.close()
        proc.wait(10)


def client(port, timeout_s=5.0):
    return dist.TCPStore(HOST, port, None, False, datetime.timedelta(seconds=timeout_s))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_torch_clients_get_tcpstore_semantics_from_the_bounded_store(serve):
    c = client(serve())
    c.set("k", b"v1")
    assert c.get("k") == b"v1"
    # compare_set: swap on a match; the value now on a mismatch; a missing key written only when expecting ""
    assert c.compare_set("k", b"v1", b"v2") == b"v2" and c.compare_set("k", b"zz", b"v3") == b"v2"
    assert c.compare_set("absent", b"x", b"y") == b"x" and not c.check(["absent"])
    assert c.compare_set("new", b"", b"n") == b"n"
    assert (c.add("n", 5), c.add("n", 2)) == (5, 7)
    assert c.check(["k", "n"]) and not c.check(["k", "zz"])
    c.append("ap", b"xy")
    c.append("ap", b"z")
    c.multi_set(["a1", "a2"], [b"1", b"2"])
    assert c.multi_get(["ap", "a2"]) == [b"xyz", b"2"]
    assert sorted(c.list_keys()) == sorted(["k", "new", "n", "ap", "a1", "a2", STORE_ID_KEY]) and c.num_keys() == 7
    assert c.delete_key("k") and not c.delete_key("k")
    c.set_timeout(datetime.timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError):
        c.get("never")  # WAIT, then CANCEL_WAIT at the client's timeout: the connection stays usable
    c.set_timeout(datetime.timedelta(seconds=5))
    assert c.get("ap") == b"xyz"
    other = c.clone()
    waiter = client(other.port)
    t = time.monotonic()
    import threading

    threading.Timer(0.3, lambda: other.set("late", b"L")).start()
    waiter.wait(["late"])  # woken by another client's set
    assert waiter.get("late") == b"L" and time.monotonic() - t < 3


def test_the_store_id_is_the_servers_and_no_client_changes_it(serve):
    c = client(serve())
    sid = c.get(STORE_ID_KEY)
    assert len(sid) == 32
    c.set(STORE_ID_KEY, b"mine")
    c.delete_key(STORE_ID_KEY)
    assert c.compare_set(STORE_ID_KEY, "", "claim") == sid and c.get(STORE_ID_KEY) == sid


def test_keyed_by_the_secret_a_job_value_is_replaced_only_by_a_later_sealed_one(serve):
    c, signer = client(serve(secret=SECRET)), Signer(SECRET)
    old = signer.seal("wb/ann", b"v1")
    new = signer.seal("wb/ann", b"v2")
    c.set("wb/ann", old)
    c.set("wb/ann", new)
    for stale in (b"garbage", old, Signer(b"another-secret-0123456789").seal("wb/ann", b"v9")):
        c.set("wb/ann", stale)  # refused: unsealed, replayed, or sealed with another secret
    assert c.get("wb/ann") == new
    c.delete_key("wb/ann")
    c.set("wb/ann", old)  # a replay after a delete: refused too (the key's stamp is kept)
    assert not c.check(["wb/ann"])
    c.set("wb/ann", b"garbage")  # an empty key takes anything (into the other pool)
    newest = signer.seal("wb/ann", b"v3")
    c.set("wb/ann", newest)
    assert c.get("wb/ann") == newest


@pytest.mark.parametrize("abuse", ["value", "append", "queue", "not-a-client", "request-while-waiting"])
def test_a_request_past_a_bound_closes_that_connection_only(serve, abuse):
    port = serve(limits=Limits(value_bytes=4096))
    good, bad = client(port), client(port)
    good.set("k", b"v")
    with pytest.raises(Exception):
        if abuse == "value":
            bad.set("big", b"x" * 5000)
        elif abuse == "append":
            for _ in range(10):
                bad.append("grow", b"x" * 1000)
        elif abuse == "queue":
            bad.queue_push("q", b"x")
        elif abuse == "not-a-client":
            with socket.create_connection((HOST, port), timeout=5) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
                assert raw.recv(10) == b""  # closed
            raise ConnectionError("closed")
        else:
            conn = StoreConnection(HOST, port, time.monotonic() + 5)
            conn._send(b"\x06" + (1).to_bytes(8, "little") + (6).to_bytes(8, "little") + b"/never", time.monotonic() + 5)
            conn.set("x", b"1", time.monotonic() + 5)  # pipelined behind its own pending WAIT
            conn.check(["x"], time.monotonic() + 5)
        bad.check(["k"])  # the set / append / push went through unanswered: the next call finds the connection closed
    assert good.get("k") == b"v" and not good.check(["big"])


def test_past_its_key_bound_a_pool_drops_its_oldest_keys(serve):
    c = client(serve(limits=Limits(keys=100, bytes=1 << 20)))
    for i in range(250):
        c.set(f"k{i}", b"v")
    assert c.num_keys() == 101  # 100 and the store id
    assert not c.check(["k149"]) and c.check(["k150"]) and c.check(["k249"])


def test_past_its_connection_bound_the_least_recently_active_connection_is_closed(serve):
    port = serve(limits=Limits(connections=4))
    idle = client(port)
    busy = [client(port) for _ in range(3)]
    for b in busy:
        b.set("k", b"v")
    newest = client(port)  # the fifth: the idle one goes
    assert newest.get("k") == b"v" and all(b.check(["k"]) for b in busy)
    with pytest.raises(RuntimeError):
        idle.check(["k"])


@pytest.mark.slow
def test_a_stranger_writing_200k_keys_leaves_the_store_within_its_bound_and_the_job_keys_in_place(serve):
    """Issue 26: 200,046 keys written in 30 s without the secret grew torch's TCPStore server by 41 MB, for
    good. With the job secret the bounded store keeps them in the other pool (8 MiB, 16k keys): measured
    +8 MiB after two such floods (bench/store_flood.py), every job key kept. The bound asserted here is the
    one docs/control_store.md states."""
    port = serve(secret=SECRET)
    pid = next(p for p in _children() if _listens(p, port))
    job, signer = client(port), Signer(SECRET)
    keys = [f"wb/e1/hello/rollout/{i}" for i in range(200)]
    for k in keys:
        job.set(k, signer.seal(k, b'{"kind": "hello"}'))
    job.check(keys[:1])
    idle = rss_mib(pid)
    stranger = client(port)
    t = time.monotonic()
    for i in range(200_000):
        stranger.set(f"wb/x/{i:08d}", b"x" * 64)
    stranger.check(["wb/x/0"])
    took = time.monotonic() - t
    grown = rss_mib(pid) - idle
    assert took < 30 and grown < 24, (took, grown)
    assert all(job.check([k]) for k in keys) and job.num_keys() <= 16_384 + 200 + 1


def test_the_hosted_store_exits_with_the_process_that_hosts_it(tmp_path):
    code = ("import sys, time; from weightbridge.transport.store import open_store\n"
            "s = open_store('127.0.0.1', 0, is_master=True, timeout_s=10)\n"
            "print(s.port, flush=True); time.sleep(60)\n")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        port = int(host.stdout.readline())
        client(port).set("k", b"v")
        host.send_signal(signal.SIGKILL)
        host.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, port), timeout=0.5).close()
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the store outlived the process hosting it")
    finally:
        host.kill()


def test_a_store_that_stops_answering_ends_a_call_by_its_deadline(serve):
    """torch's client waits for an answer without a timeout (a stopped store host held every rank for
    minutes); the bridges' client gives up at the call's deadline."""
    port = serve()
    conn = StoreConnection(HOST, port, time.monotonic() + 5)
    pid = next(p for p in _children() if _listens(p, port))
    os.kill(pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(StoreConnectionLost):
            conn.check(["k"], time.monotonic() + 0.5)
        assert time.monotonic() - t < 1.5
    finally:
        os.kill(pid, signal.SIGCONT)


def test_open_store_hosts_a_bounded_store_with_an_id():
    hosted = open_store(HOST, 0, is_master=True, timeout_s=5)
    assert hosted.get(STORE_ID_KEY).decode() == hosted.store_id and hosted.server.poll() is None
    proc = hosted.server
    del hosted
    proc.wait(5)  # released with its last reference


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(pid))
            except OSError:
                pass
    return out


def _listens(pid: int, port: int) -> bool:
    """Whether ``pid`` holds the listening socket of ``port`` (its inode in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A" and cols[9] in inodes:
                    return True
    return False
