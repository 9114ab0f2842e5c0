"""Many hosts on one machine: network namespaces joined by shaped links (tests and ``bench/cluster.py``).

Topology; every namespace, link and address lives inside namespaces this run creates (named
``wbc-<pid>-<n>-...``), the machine's own namespace gets nothing::

    host i (netns wbc-P-N-h<i>)                               switch (netns wbc-P-N-sw)
      lo               intra-host traffic (loopback)
      wbc0  10.200.0.<i+1>/24  ====== veth ======  h<i>  --  br0 (a Linux bridge)
      tbf on wbc0: what host i sends               tbf on h<i>: what host i receives

``tc tbf`` on both ends of a host's veth is its NIC rate, each way; a cut is ``ip link set wbc0
down`` inside the host. A rank "on host i" is a process that entered the host's namespace
(``setns``) before it opened any socket, with ``GLOO_SOCKET_IFNAME=wbc0``: its Gloo and store
connections to other hosts cross both shaped links, those to ranks of its own host stay on loopback.
Links have a rate, not latency or loss (this kernel has no ``netem``); latency to the control store
comes from :mod:`.delay_proxy` (``bench/control_rtt.py``).

Who calls what: the test or bench process builds a :class:`Cluster` (``with Cluster(...) as c``),
starts ranks with :meth:`Cluster.launch` (``weightbridge.localrun.launch`` underneath:
every process is killed at the deadline) and, for an external control store, :meth:`Cluster.start_store`.
:meth:`Cluster.down` (``__exit__``, and ``atexit``) kills every process left in the namespaces and
deletes them, within a bounded time, also after a failure; a later cluster also removes namespaces of
dead creators (a run killed with SIGKILL). Without root, ``ip`` or ``tc`` :func:`unavailable` says why
(tests skip with it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "wbc-"
IFNAME = "wbc0"  # every host's link, in its own namespace
SUBNET = "10.200.0"
MTU = 9000  # jumbo frames, as cluster fabrics use: TCP/IP headers are ~0.7% of the bytes
CLONE_NEWNET = 0x40000000
CMD_TIMEOUT_S = 10.0  # one ip / tc command
HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12: per frame (a GSO frame counts once)
STALE_S = 60.0  # a dead creator's namespaces older than this are removed by the next cluster
QUEUE_MS = 20.0  # a link's queue (tbf ``latency``): shallow, as a switch port's; deep queues stall duplex TCP


@dataclass(frozen=True)
class Link:
    """One host's link: ``gbit`` each way."""

    gbit: float = 1.0


@dataclass(frozen=True)
class Counters:
    """A host link's counters, as the host sees them (``tx``: sent by the host), and the host's TCP
    retransmitted segments (resent payload counts twice on the link)."""

    tx_bytes: int
    tx_packets: int
    rx_bytes: int
    rx_packets: int
    retrans_segs: int = 0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.tx_bytes - other.tx_bytes, self.tx_packets - other.tx_packets,
                        self.rx_bytes - other.rx_bytes, self.rx_packets - other.rx_packets,
                        self.retrans_segs - other.retrans_segs)

    @property
    def tx_payload(self) -> int:
        """TCP payload sent: frame bytes less one header per frame (every frame here is TCP/IPv4)."""
        return self.tx_bytes - HEADER_BYTES * self.tx_packets

    @property
    def rx_payload(self) -> int:
        return self.rx_bytes - HEADER_BYTES * self.rx_packets


def _run(*argv: str, check: bool = True, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()[:500]}")
    return res


_UNAVAILABLE: list[str | None] = []
REQUIRE_ENV = "WEIGHTBRIDGE_REQUIRE_NETNS"  # "1": a test that needs a cluster fails instead of skipping (CI, as root)


def require() -> None:
    """For a test module that needs a cluster: skip it (with the reason) when clusters cannot be built
    here, or fail under ``$WEIGHTBRIDGE_REQUIRE_NETNS=1`` (CI runs as root: a skip there hides a break)."""
    import pytest

    reason = unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but no cluster of network namespaces here: {reason}", pytrace=False)
    pytest.skip(f"no cluster of network namespaces here: {reason}", allow_module_level=True)


def unavailable() -> str | None:
    """Why clusters cannot be built here (None: they can). Checked once per process: root, ``ip`` and
    ``tc``, and a probe namespace with a veth and a ``tbf`` qdisc (created and deleted)."""
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    reason = _probe()
    _UNAVAILABLE.append(reason)
    return reason


def _probe() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"network namespaces need root (running as uid {getattr(os, 'geteuid', lambda: '?')()})"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"iproute2's {' and '.join(missing)} not found (install iproute2)"
    ns = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", ns)
        try:
            _run("ip", "-n", ns, "link", "add", "wbcp0", "type", "veth", "peer", "name", "wbcp1")
            _run("tc", "-n", ns, "qdisc", "add", "dev", "wbcp0", "root", "tbf", "rate", "1gbit", "burst", "256kb",
                 "latency", "50ms")
        finally:
            _run("ip", "netns", "del", ns, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot build network namespaces with shaped links here: {str(exc)[:300]}"
    return None


def enter_netns(name: str) -> None:
    """Move the calling thread (and the threads it starts later) into network namespace ``name``."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def on_host(netns: str, env: dict[str, str], fn: Callable, args: tuple) -> Any:
    """A launched process's body: enter ``netns``, set ``env`` (``GLOO_SOCKET_IFNAME``), run ``fn(*args)``."""
    enter_netns(netns)
    os.environ.update(env)
    return fn(*args)


def read_counters(ifname: str = IFNAME) -> Counters:
    """The counters of ``ifname`` in the calling process's network namespace (``/proc/self/net/dev``,
    retransmissions from ``/proc/self/net/snmp``)."""
    snmp = [line.split() for line in Path("/proc/self/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
    retrans = int(dict(zip(snmp[0], snmp[1])).get("RetransSegs", 0)) if len(snmp) == 2 else 0
    for line in Path("/proc/self/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == ifname:
            f = [int(x) for x in rest.split()]
            return Counters(tx_bytes=f[8], tx_packets=f[9], rx_bytes=f[0], rx_packets=f[1], retrans_segs=retrans)
    raise KeyError(f"no interface {ifname} here")


_ACTIVE: set[Cluster] = set()
_SEQ = [0]


class Cluster:
    """``hosts`` namespace hosts, each with its own :class:`Link` (or all with ``link``) to one bridge.

    Use as a context manager; :meth:`down` is idempotent and always runs. Addresses are
    :meth:`address`; namespaces :meth:`netns`; the interface inside every host is ``wbc0``.
    """

    def __init__(self, hosts: int | Sequence[Link], *, link: Link = Link(), timeout_s: float = 60.0) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.links = [link] * hosts if isinstance(hosts, int) else list(hosts)
        if not 1 <= len(self.links) <= 200:
            raise ValueError(f"1 to 200 hosts, got {len(self.links)}")
        _SEQ[0] += 1
        self.name = f"{PREFIX}{os.getpid()}-{_SEQ[0]}"
        self.timeout_s = timeout_s
        self._made: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self._lock = threading.Lock()
        self._down = False

    # -- names ------------------------------------------------------------------------------
    def netns(self, host: int) -> str:
        return f"{self.name}-h{host}"

    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def __len__(self) -> int:
        return len(self.links)

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def up(self) -> None:
        sweep_stale()
        _ACTIVE.add(self)
        self._add_ns(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "mtu", str(MTU), "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for h, link in enumerate(self.links):
            ns = self.netns(h)
            self._add_ns(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", IFNAME, "netns", ns, "mtu", str(MTU), "type", "veth",
                 "peer", "name", f"h{h}", "netns", self.switch, "mtu", str(MTU))
            for where, dev in ((ns, IFNAME), (self.switch, f"h{h}")):
                _run("ip", "-n", where, "link", "set", dev, "addrgenmode", "none")  # no IPv6 chatter on the link
            _run("ip", "-n", self.switch, "link", "set", f"h{h}", "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", f"h{h}", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", IFNAME)
            _run("ip", "-n", ns, "link", "set", IFNAME, "up")
            self.set_rate(h, link.gbit, add=True)

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._made.append(ns)

    def down(self) -> None:
        """Kill every process in the namespaces and delete the namespaces (bounded: ~5 s per namespace at most)."""
        with self._lock:
            if self._down:
                return
            self._down = True
        try:
            for p in self._procs:
                _kill(p)
            for ns in reversed(self._made):
                remove_netns(ns)
        finally:
            _ACTIVE.discard(self)
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- shaping and faults -----------------------------------------------------------------
    def set_rate(self, host: int, gbit: float, *, add: bool = False) -> None:
        """Host ``host``'s link rate, each way (``tc tbf`` on both ends of its veth)."""
        if not gbit > 0:
            raise ValueError(f"rate must be positive, got {gbit}")
        rate = f"{int(gbit * 1e6)}kbit"
        for ns, dev in ((self.netns(host), IFNAME), (self.switch, f"h{host}")):
            _run("tc", "-n", ns, "qdisc", "add" if add else "change", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", "512kb", "latency", f"{QUEUE_MS:g}ms")

    def cut(self, host: int) -> None:
        """Take host ``host``'s link down (its NIC loses carrier: nothing gets in or out)."""
        _run("ip", "-n", self.netns(host), "link", "set", IFNAME, "down")

    def restore(self, host: int) -> None:
        _run("ip", "-n", self.netns(host), "link", "set", IFNAME, "up")

    def counters(self, host: int) -> Counters:
        """Host ``host``'s link counters, read from outside (``ip -s -j``)."""
        out = _run("ip", "-n", self.netns(host), "-s", "-j", "link", "show", "dev", IFNAME).stdout
        st = json.loads(out)[0]["stats64"]
        return Counters(st["tx"]["bytes"], st["tx"]["packets"], st["rx"]["bytes"], st["rx"]["packets"])

    # -- processes --------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What every rank process gets: Gloo (and NCCL's socket bootstrap) use the host's link."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "NCCL_SOCKET_IFNAME": IFNAME}

    def launch(self, fn: Callable, placed: Sequence[tuple[int, tuple]], *, timeout_s: float, threads: int = 1,
               preload: Sequence[str] = ()) -> list:
        """Run ``fn(*args)`` for each ``(host, args)`` of ``placed``, each in a fresh process on that host.

        ``fn`` must be importable (module-level). Returns ``localrun.RankResult`` per process, in
        order; a process still running at ``timeout_s`` is killed."""
        from weightbridge.localrun import launch

        env = self.env()
        return launch(on_host, [(self.netns(h), env, fn, tuple(args)) for h, args in placed],
                      timeout_s=timeout_s, threads=threads, preload=preload)

    def start_store(self, host: int, port: int = 29400, timeout_s: float = 60.0) -> tuple[str, int]:
        """An external control store (``weightbridge store``) on host ``host``; ``(address, port)``.
        Stopped by :meth:`down`."""
        port_file = self._tmp / f"store-{len(self._procs)}.port"
        addr = self.address(host)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(host), sys.executable, "-m", "weightbridge", "store", "--host", addr,
             "--port", str(port), "--port-file", str(port_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
        )
        self._procs.append(proc)
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill(proc)
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"weightbridge store on host {host} did not start: {err[-500:]}")
            time.sleep(0.05)
        got_host, got_port = port_file.read_text().strip().rsplit(":", 1)
        return got_host, int(got_port)

    def pids(self) -> list[int]:
        """Processes inside this cluster's namespaces now."""
        out: list[int] = []
        for ns in self._made:
            res = _run("ip", "netns", "pids", ns, check=False)
            out += [int(x) for x in res.stdout.split() if x.isdigit()]
        return out


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def remove_netns(ns: str) -> None:
    """SIGKILL what runs in namespace ``ns`` (all of it was started by the run that made ``ns``), then delete it."""
    res = _run("ip", "netns", "pids", ns, check=False)
    for pid in (int(x) for x in res.stdout.split() if x.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and _run("ip", "netns", "pids", ns, check=False).stdout.split():
        time.sleep(0.05)
    _run("ip", "netns", "del", ns, check=False)


def ours() -> list[str]:
    """Every namespace on this machine with the harness's prefix (any run's)."""
    res = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith(PREFIX)]


def sweep_stale() -> list[str]:
    """Delete namespaces left by runs whose process is gone (killed with SIGKILL: no cleanup ran):
    only those with no process inside, whose creator pid is dead, older than ``STALE_S``."""
    removed = []
    for ns in ours():
        pid = ns[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            age = time.time() - os.stat(f"/run/netns/{ns}").st_mtime
        except OSError:
            continue
        if age > STALE_S and not _run("ip", "netns", "pids", ns, check=False).stdout.split():
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _down_all() -> None:
    for c in list(_ACTIVE):
        c.down()
