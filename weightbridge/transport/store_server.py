"""The bounded control store: a TCPStore-protocol server whose memory a stranger cannot grow without limit.

``torch.distributed.TCPStore``'s own server keeps whatever any client writes: keys without limit,
values grown by ``append`` without limit, queues that no key listing shows, and a partial request of
up to 8 MiB per connection for any number of connections (issue 26: 200k keys written without the
job secret grew the store's host by 41 MB, for good). This server speaks the same protocol
(:mod:`.store_wire`; torch's client connects to it unchanged) with bounds on all of it:

* **two pools of keys.** With the job secret (given by trainer rank 0's bridge, or ``weightbridge
  store`` with ``$WEIGHTBRIDGE_SECRET`` / ``--secret-file``), a value that carries the secret's MAC for
  its key (every value the bridges write, :mod:`weightbridge.sync.auth`) goes to the *job* pool; any
  other value to the *other* pool. Each pool holds at most :class:`Limits` keys and bytes (key +
  value); past a bound, the pool's least recently written keys are dropped (as if deleted; a stranger
  can delete keys anyway). So a stranger fills the other pool at most, and never displaces a job
  key. Without a secret there is one pool, the job pool's size;
* **fresh job values.** With the secret, a job key's value is replaced only by a value sealed later
  (its stamp, :func:`weightbridge.sync.auth.stamp_now`), never by one without the MAC nor by a
  replayed older one, also after the key was deleted (its stamp is kept). A stranger can still
  delete a key, never put an old value of the job back under it;
* ``weightbridge/store-id`` is the server's own, set at start and never changed or deleted by a client
  (clients tell a restarted, empty store by it: :mod:`.store_client`);
* values up to :attr:`Limits.value_bytes`, requests up to twice that, at most
  :attr:`Limits.connections` connections (a new one closes the least recently active), input and
  output held for all connections together up to :attr:`Limits.buffered_bytes` (past it the
  connection holding the most is closed), one pending ``WAIT`` per connection; queue requests are not
  served (the connection is closed);
* a request that breaks the protocol or a bound closes its connection; ``ADD`` on a value that is not
  an integer too (as in TCPStore).

Runs in a process of its own, single-threaded (``selectors``): ``weightbridge store``, or a child that
trainer rank 0's ``from_spec`` / ``weightbridge.open_store(is_master=True)`` starts and that exits when
its parent does (:mod:`.store_host`). Memory bound: ``docs/control_store.md``
(measured by ``bench/store_flood.py``).
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from weightbridge.errors import ForgedMessage
from weightbridge.sync.auth import Signer
from weightbridge.transport.store_wire import MAGIC, Q, WIRE_KEY_PREFIX, pack_bytes

STORE_ID_KEY = "weightbridge/store-id"  # clients' key (the wire adds "/")
MAX_KEY_BYTES = 8 * 1024  # TCPStore's own bound on a key


@dataclass(frozen=True)
class Limits:
    """What one store holds at most (defaults: ``docs/control_store.md``)."""

    keys: int = 65_536  # job pool (values with the job secret's MAC; without a secret: every value)
    bytes: int = 32 << 20
    other_keys: int = 16_384  # values without the MAC, when the server has the secret
    other_bytes: int = 8 << 20
    value_bytes: int = (1 << 20) + 4096  # a control message is at most 1 MiB (sync.messages) + its MAC
    connections: int = 1024
    buffered_bytes: int = 64 << 20  # requests being received + answers being sent, all connections


class _Pool:
    """Keys in the order they were last written; dropped oldest first past ``keys`` / ``nbytes``."""

    def __init__(self, name: str, keys: int, nbytes: int) -> None:
        self.name, self.max_keys, self.max_bytes = name, keys, nbytes
        self.data: OrderedDict[str, bytes] = OrderedDict()
        self.size = 0
        self.dropped = 0

    def put(self, key: str, value: bytes) -> None:
        old = self.data.pop(key, None)
        if old is not None:
            self.size -= len(key) + len(old)
        self.data[key] = value
        self.size += len(key) + len(value)
        while len(self.data) > self.max_keys or self.size > self.max_bytes:
            k, v = self.data.popitem(last=False)
            self.size -= len(k) + len(v)
            self.dropped += 1

    def pop(self, key: str) -> bytes | None:
        old = self.data.pop(key, None)
        if old is not None:
            self.size -= len(key) + len(old)
        return old


class Violation(Exception):
    """The client broke the protocol or a bound: its connection is closed."""


class _NeedMore(Exception):
    pass


class _Reader:
    def __init__(self, buf: bytearray, max_request: int) -> None:
        self.buf, self.pos, self.max_request = buf, 0, max_request

    def take(self, n: int) -> bytes:
        if self.pos + n > self.max_request:
            raise Violation(f"a request over {self.max_request} bytes")
        if self.pos + n > len(self.buf):
            raise _NeedMore
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self) -> int:
        return struct.unpack("<q", self.take(8))[0]

    def key(self) -> str:
        n = self.u64()
        if n > MAX_KEY_BYTES:
            raise Violation(f"a {n}-byte key")
        return self.take(n).decode("utf-8", "surrogateescape")

    def value(self, limit: int) -> bytes:
        n = self.u64()
        if n > limit:
            raise Violation(f"a {n}-byte value (limit {limit})")
        return self.take(n)

    def count(self) -> int:
        n = self.u64()
        if n * 8 > self.max_request:
            raise Violation(f"{n} keys in one request")
        return n


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "validated", "last", "waiting", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.inbuf, self.outbuf = sock, bytearray(), bytearray()
        self.validated, self.last, self.writing = False, time.monotonic(), False
        self.waiting: set[str] | None = None  # keys of its pending WAIT


class StoreServer:
    """The bounded store on a listening socket (call :meth:`run`; :meth:`stop` from a signal handler)."""

    def __init__(self, listener: socket.socket, *, secret: bytes | None = None, limits: Limits = Limits()) -> None:
        self.limits = limits
        self.listener = listener
        listener.setblocking(False)
        self._signer = Signer(secret.strip()) if secret else None  # values sealed by any rank verify here
        self.job = _Pool("job", limits.keys, limits.bytes)
        self.other = _Pool("other", limits.other_keys, limits.other_bytes) if self._signer else self.job
        # keyed by the secret: the stamp of each job key's value, kept after a delete (a replay of an older
        # value is refused even then), at most 2 x limits.keys (the oldest forgotten first)
        self.stamps: OrderedDict[str, int] = OrderedDict()
        self.refused = 0  # writes that would have replaced a job value with an older or unsealed one
        self.store_id = uuid.uuid4().hex
        self._pinned = {WIRE_KEY_PREFIX + STORE_ID_KEY: self.store_id.encode()}
        self.conns: dict[int, _Conn] = {}
        self.waiters: dict[str, list[_Conn]] = {}
        self.buffered = 0
        self.max_request = 2 * limits.value_bytes + 2 * MAX_KEY_BYTES + 64
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)
        self._stop = False
        self.closed_for: dict[str, int] = {}  # why connections were closed (counts; for tests and logs)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def stop(self) -> None:
        self._stop = True

    # -- the loop -----------------------------------------------------------------------------
    def run(self, *, until: Any = None, tick_s: float = 0.1) -> None:
        """Serve until :meth:`stop`, or until ``until()`` (checked every ``tick_s``) is true."""
        while not self._stop and not (until is not None and until()):
            for sk, events in self.sel.select(tick_s):
                if sk.data is None:
                    self._accept()
                elif callable(sk.data):
                    sk.data()
                else:
                    conn = sk.data
                    if events & selectors.EVENT_READ:
                        self._read(conn)
                    if events & selectors.EVENT_WRITE and self._open(conn):
                        self._flush(conn)
                        if self._open(conn) and not conn.outbuf and conn.inbuf:
                            self._serve_or_close(conn)  # requests held back while answers piled up
        for conn in list(self.conns.values()):
            self._close(conn, None)
        self.sel.close()
        self.listener.close()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        if len(self.conns) >= self.limits.connections:
            self._close(min(self.conns.values(), key=lambda c: c.last), "connections")
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        self.conns[sock.fileno()] = conn
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn, why: str | None) -> None:
        if self.conns.pop(conn.sock.fileno(), None) is None:
            return
        if why:
            self.closed_for[why] = self.closed_for.get(why, 0) + 1
        self.buffered -= len(conn.inbuf) + len(conn.outbuf)
        self._unwait(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn, None)
            return
        conn.last = time.monotonic()
        conn.inbuf += data
        self.buffered += len(data)
        if not self._serve_or_close(conn):
            return
        if self.buffered > self.limits.buffered_bytes:
            self._close(max(self.conns.values(), key=lambda c: len(c.inbuf) + len(c.outbuf)), "buffered bytes")

    def _open(self, conn: _Conn) -> bool:
        return self.conns.get(conn.sock.fileno()) is conn

    def _serve_or_close(self, conn: _Conn) -> bool:
        """Answer every complete request in ``conn.inbuf`` while its answers are not piling up; False
        when a request broke the protocol or a bound (the connection is closed then)."""
        try:
            while conn.inbuf and len(conn.outbuf) < (1 << 20) and self._open(conn):
                reader = _Reader(conn.inbuf, self.max_request)
                try:
                    self._request(conn, reader)
                except _NeedMore:
                    break
                del conn.inbuf[:reader.pos]
                self.buffered -= reader.pos
        except Violation as exc:
            self._close(conn, str(exc).split(" (")[0][:60])
            return False
        return self._open(conn)

    def _reply(self, conn: _Conn, data: bytes) -> None:
        conn.outbuf += data
        self.buffered += len(data)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn, None)
            return
        del conn.outbuf[:sent]
        self.buffered -= sent
        writing = bool(conn.outbuf)
        if writing != conn.writing:  # wait for the socket to drain only while answers are pending
            conn.writing = writing
            self.sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0), conn)

    # -- requests -------------------------------------------------------------------------------
    def _request(self, conn: _Conn, r: _Reader) -> None:
        cmd = r.u8()
        if not conn.validated:
            if cmd != Q.VALIDATE or struct.unpack("<I", r.take(4))[0] != MAGIC:
                raise Violation("not a TCPStore client")
            conn.validated = True
            return
        if conn.waiting is not None and cmd != Q.CANCEL_WAIT:
            raise Violation("a request while its wait is pending")
        vmax = self.limits.value_bytes
        if cmd == Q.PING:
            self._reply(conn, r.take(4))
        elif cmd == Q.SET:
            key, value = r.key(), r.value(vmax)
            self._set(key, value)
        elif cmd == Q.COMPARE_SET:
            key, expected, desired = r.key(), r.value(vmax), r.value(vmax)
            current = self._get(key)
            if key in self._pinned:
                pass
            elif current is None and not expected:
                self._set(key, desired)
                current = self._get(key) or b""  # desired, unless refused (an older or unsealed value)
            elif current is None:
                current = expected  # TCPStore answers the expected value for a missing key (and writes nothing)
            elif current == expected:
                self._set(key, desired)
                current = self._get(key) or b""
            self._reply(conn, pack_bytes(current))
        elif cmd == Q.GET:
            self._reply(conn, pack_bytes(self._get(r.key()) or b""))
        elif cmd == Q.ADD:
            key, amount = r.key(), r.i64()
            current = self._get(key)
            try:
                total = amount + (int(current) if current is not None else 0)
            except ValueError:
                raise Violation("add on a value that is not an integer") from None
            self._set(key, str(total).encode())
            self._reply(conn, struct.pack("<q", total))
        elif cmd == Q.CHECK:
            keys = [r.key() for _ in range(r.count())]
            self._reply(conn, bytes([0 if all(self._get(k) is not None for k in keys) else 1]))
        elif cmd == Q.WAIT:
            keys = {r.key() for _ in range(r.count())}
            missing = {k for k in keys if self._get(k) is None}
            if not missing:
                self._reply(conn, b"\x00")
            else:
                conn.waiting = missing
                for k in missing:
                    self.waiters.setdefault(k, []).append(conn)
        elif cmd == Q.CANCEL_WAIT:
            self._unwait(conn)
            self._reply(conn, b"\x01")
        elif cmd == Q.GETNUMKEYS:
            self._reply(conn, struct.pack("<q", len(self._keys())))
        elif cmd == Q.DELETE_KEY:
            key = r.key()  # a job key's stamp stays (self.stamps): no older value can come back under it
            n = 0 if key in self._pinned else int(self.job.pop(key) is not None or self.other.pop(key) is not None)
            self._reply(conn, struct.pack("<q", n))
        elif cmd == Q.APPEND:
            key, value = r.key(), r.value(vmax)
            current = self._get(key) or b""
            if len(current) + len(value) > vmax:
                raise Violation(f"append past the {vmax}-byte value limit")
            self._set(key, current + value)
        elif cmd == Q.MULTI_GET:
            keys = [r.key() for _ in range(r.count())]
            self._reply(conn, b"".join(pack_bytes(self._get(k) or b"") for k in keys))
        elif cmd == Q.MULTI_SET:
            pairs = [(r.key(), r.value(vmax)) for _ in range(r.count())]
            for key, value in pairs:
                self._set(key, value)
        elif cmd == Q.LIST_KEYS:
            keys = self._keys()
            self._reply(conn, struct.pack("<Q", len(keys)) + b"".join(pack_bytes(k.encode("utf-8", "surrogateescape"))
                                                                       for k in keys))
        else:
            raise Violation(f"request {cmd} is not served")

    # -- the keys -------------------------------------------------------------------------------
    def _keys(self) -> list[str]:
        return [*self._pinned, *self.job.data, *(self.other.data if self.other is not self.job else ())]

    def _get(self, key: str) -> bytes | None:
        if key in self._pinned:
            return self._pinned[key]
        value = self.job.data.get(key)
        return value if value is not None else self.other.data.get(key)

    def _set(self, key: str, value: bytes) -> None:
        if key in self._pinned:
            return
        stamp = self._stamp(key, value)
        if self.other is not self.job:  # keyed by the secret: a job value is replaced only by a later job value
            held = self.stamps.get(key)
            if held is not None and (stamp is None or stamp <= held):
                self.refused += 1
                return
        if stamp is not None and self.other is not self.job:
            self.stamps[key] = stamp
            self.stamps.move_to_end(key)
            while len(self.stamps) > self.limits.keys * 2:  # tombstones of deleted keys included
                self.stamps.popitem(last=False)
        pool = self.job if stamp is not None else self.other
        (self.other if pool is self.job else self.job).pop(key)
        pool.put(key, value)
        for conn in self.waiters.pop(key, ()):
            if conn.waiting is not None:
                conn.waiting.discard(key)
                if not conn.waiting and self._open(conn):
                    conn.waiting = None
                    self._reply(conn, b"\x00")

    def _stamp(self, key: str, value: bytes) -> int | None:
        """The stamp of ``value`` if it carries the job secret's MAC for ``key`` (as the bridges seal it,
        :class:`weightbridge.sync.auth.Signer`), else None; without a secret every value is a job value (0)."""
        if self._signer is None:
            return 0
        try:
            return self._signer.open_stamped(key[len(WIRE_KEY_PREFIX):] if key.startswith(WIRE_KEY_PREFIX) else key,
                                             value)[0]
        except ForgedMessage:
            return None

    def _unwait(self, conn: _Conn) -> None:
        if conn.waiting is None:
            return
        for k in conn.waiting:
            waiting = self.waiters.get(k)
            if waiting and conn in waiting:
                waiting.remove(conn)
                if not waiting:
                    del self.waiters[k]
        conn.waiting = None
