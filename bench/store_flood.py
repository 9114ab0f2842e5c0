"""A stranger floods the control store: how much does the store's host grow? (issue 26, item 3)

    python bench/store_flood.py                      # 200k keys in <= 30 s against each server, RSS before/after
    python bench/store_flood.py --keys 50000 --json out.json

For each server (torch's ``TCPStore`` server, the bounded store with and without the job secret), in
its own process: the job writes its keys (sealed with the secret, as the bridges do), a stranger
without the secret writes ``--keys`` keys with ``--value-bytes`` values through torch's own client,
then a second flood of the same size; a third round appends to one key and pushes to a queue. Prints
the host process's RSS (``/proc/PID/status``) before and after each round, how many keys it holds,
and whether every job key survived. The bound the docs state (``docs/control_store.md``) is the
bounded store's RSS after the floods. Exit 1 if a bounded store lost a job key (with the secret)
or grew past ``--bound-mib`` over its idle RSS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time

JOB_KEYS = 200  # what a small job holds: joins, heartbeats, hellos, acks, an epoch's rendezvous
SECRET = b"bench-store-flood-secret-0123456789"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start(kind: str) -> tuple[subprocess.Popen, int]:
    """The server process: ``torch`` (TCPStore's own server), ``bounded`` or ``bounded-secret``."""
    if kind == "torch":
        code = ("import datetime, sys, torch.distributed as d\n"
                "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)\n"
                "print(s.port, flush=True)\nsys.stdin.read()\n")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return proc, int(proc.stdout.readline())
    from weightbridge.transport.store import listen_socket
    from weightbridge.transport.store_host import spawn

    listener = socket.socket(fileno=listen_socket("127.0.0.1", 0))
    port = listener.getsockname()[1]
    return spawn(listener, secret=SECRET if kind == "bounded-secret" else None), port


def client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30))


def job_keys(store) -> list[str]:
    from weightbridge.sync.auth import Signer

    signer = Signer(SECRET)
    keys = [f"wb/job/{i}" for i in range(JOB_KEYS)]
    for k in keys:
        store.set(k, signer.seal(k, b'{"kind": "ack", "rank": 1}'))
    return keys


def flood(port: int, n: int, value_bytes: int, budget_s: float, tag: str) -> dict:
    """``n`` stranger keys (no secret) within ``budget_s``; returns how many were written and how fast."""
    store = client(port)
    value = os.urandom(value_bytes)
    t0 = time.monotonic()
    written = 0
    try:
        for i in range(n):
            store.set(f"wb/{tag}/{i:08d}", value)
            written += 1
            if written % 1000 == 0 and time.monotonic() - t0 > budget_s:
                break
        store.check(["wb/job/0"])  # a round trip: every set before it was served
    except RuntimeError:
        pass  # the bounded store closed the connection (a request past a bound)
    return {"written": written, "seconds": round(time.monotonic() - t0, 2)}


def abuse(port: int, value_bytes: int, rounds: int) -> dict:
    """Append to one key and push to a queue, ``rounds`` times each (unbounded on TCPStore's server)."""
    out = {}
    for name in ("append", "queue_push"):
        store, done = client(port), 0
        value = os.urandom(value_bytes)
        try:
            for _ in range(rounds):
                getattr(store, name)(f"wb/{name}", value)
                done += 1
            store.check(["wb/job/0"])
        except RuntimeError:
            pass
        out[name] = done
    return out


def run(kind: str, n: int, value_bytes: int, budget_s: float) -> dict:
    proc, port = start(kind)
    try:
        probe = client(port)
        keys = job_keys(probe)
        time.sleep(0.3)
        row = {"server": kind, "idle_mib": round(rss_mib(proc.pid), 1)}
        for i in (1, 2):
            row[f"flood{i}"] = flood(port, n, value_bytes, budget_s, f"x{i}")
            time.sleep(0.3)
            row[f"after_flood{i}_mib"] = round(rss_mib(proc.pid), 1)
        row["abuse"] = abuse(port, 64 << 10, 2000)
        time.sleep(0.3)
        row["after_abuse_mib"] = round(rss_mib(proc.pid), 1)
        probe = client(port)
        row["keys_held"] = probe.num_keys()
        row["job_keys_kept"] = sum(probe.check([k]) for k in keys)
        row["growth_mib"] = round(row["after_abuse_mib"] - row["idle_mib"], 1)
        return row
    finally:
        proc.stdin.close()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=200_000, help="stranger keys per flood (default 200k)")
    p.add_argument("--value-bytes", type=int, default=64, help="bytes per stranger value (default 64)")
    p.add_argument("--budget-s", type=float, default=30.0, help="stop a flood after this long (default 30)")
    p.add_argument("--servers", default="torch,bounded,bounded-secret")
    p.add_argument("--bound-mib", type=float, default=48.0,
                   help="the stated bound on a bounded store's growth over idle (default 48 MiB)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = [run(kind, a.keys, a.value_bytes, a.budget_s) for kind in a.servers.split(",")]
    head = (f"{'server':16} {'idle':>6} {'flood 1':>17} {'after':>7} {'flood 2':>17} {'after':>7} "
            f"{'append+queue':>13} {'after':>7} {'growth':>7} {'keys':>7} {'job keys':>8}")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        f1, f2 = r["flood1"], r["flood2"]
        print(f"{r['server']:16} {r['idle_mib']:>6} {f1['written']:>8} in {f1['seconds']:>5}s {r['after_flood1_mib']:>7} "
              f"{f2['written']:>8} in {f2['seconds']:>5}s {r['after_flood2_mib']:>7} "
              f"{r['abuse']['append']:>6}/{r['abuse']['queue_push']:<6} {r['after_abuse_mib']:>7} {r['growth_mib']:>7} "
              f"{r['keys_held']:>7} {r['job_keys_kept']:>4}/{JOB_KEYS}")
    print("(MiB of the store process's RSS; appends and queue pushes of 64 KiB each)")
    ok = all(r["growth_mib"] <= a.bound_mib for r in rows if r["server"] != "torch") and all(
        r["job_keys_kept"] == JOB_KEYS for r in rows if r["server"] == "bounded-secret")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "rows": rows, "passed": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
