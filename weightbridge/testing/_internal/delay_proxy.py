"""A TCP relay that delays every byte by a fixed time each way: control-store latency on one machine.

This kernel has no ``netem``; a relay in front of the control store gives every store round trip
``2 x delay_s`` of latency (what a store on another host or region costs), while the bridge
group's data connections stay direct. ``bench/control_rtt.py`` measures the sequential store
round trips of a push with it: ``(push time with delay - without) / (2 x delay_s)``.

Who calls what: the bench (or a test) starts a :class:`DelayProxy` in front of ``host:port`` of a
running store, points every rank at ``proxy.port``, and :meth:`DelayProxy.close` s it. Each
accepted connection gets two pump threads per direction (a reader stamping chunks with their due
time, a writer sending them when due), so order is kept and throughput is not limited by the delay.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time


class DelayProxy:
    """Listen on ``listen_host`` (a free port, :attr:`port`); relay each connection to ``target`` with
    ``delay_s`` added each way."""

    def __init__(self, target: tuple[str, int], delay_s: float, listen_host: str = "127.0.0.1") -> None:
        self.target = target
        self.delay_s = float(delay_s)
        self._sock = socket.create_server((listen_host, 0))
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="delay-proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                q: queue.Queue = queue.Queue()
                threading.Thread(target=self._read, args=(src, q), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, q), daemon=True).start()

    def _read(self, src: socket.socket, q: queue.Queue) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            q.put((time.monotonic() + self.delay_s, data))
            if not data:
                return

    def _write(self, dst: socket.socket, q: queue.Queue) -> None:
        while True:
            due, data = q.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for s in self._conns:
                with contextlib.suppress(OSError):
                    s.close()
