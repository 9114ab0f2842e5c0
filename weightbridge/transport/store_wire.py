"""The wire protocol of ``torch.distributed.TCPStore``, and a client of it whose every call ends by a deadline.

Pure Python (``socket``, ``struct``): imported by the bounded store server (a process that loads no
torch, :mod:`.store_server`) and by every rank's store client (:mod:`.store_client`).

The protocol, as torch 2.13's client speaks it (checked against the client in
``tests/transport/test_store_server.py``). Integers are little-endian; a *string* or *bytes* is a
``u64`` length and the bytes; the client prefixes every key with ``/``:

===============  ====  ===========================================  ===============================
request          code  arguments                                    response
===============  ====  ===========================================  ===============================
VALIDATE         0     ``u32`` magic (the first request only)        none
SET              1     key, value                                   none
COMPARE_SET      2     key, expected, desired                       bytes: the value now
GET              3     key                                          bytes (empty: no such key)
ADD              4     key, ``i64``                                 ``i64``: the sum
CHECK            5     ``u64`` n, n keys                            ``u8``: 0 all there, 1 not
WAIT             6     ``u64`` n, n keys                            ``u8`` 0 once all are there
GETNUMKEYS       7                                                  ``i64``
DELETE_KEY       8     key                                          ``i64``: keys deleted
APPEND           9     key, value                                   none
MULTI_GET        10    ``u64`` n, n keys                            n bytes
MULTI_SET        11    ``u64`` n, n (key, value)                    none
CANCEL_WAIT      12                                                 ``u8`` 1
PING             13    ``u32`` nonce                                ``u32`` nonce
QUEUE_PUSH/POP/  14-16 (queues)                                     (not served by weightbridge)
LEN
LIST_KEYS        17                                                 ``u64`` n, n strings
===============  ====  ===========================================  ===============================

Why a client of our own: ``TCPStore``'s client waits for a response without any timeout (a store
host that is stopped, or a link that drops packets, blocks ``check``, ``get`` and ``compare_set``
until TCP gives up, many minutes later); :class:`StoreConnection` bounds every call by a deadline.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

__all__ = ["MAGIC", "Q", "StoreConnection", "StoreConnectionLost", "WIRE_KEY_PREFIX", "pack_bytes"]

MAGIC = 0x3C85F7CE
WIRE_KEY_PREFIX = "/"  # what TCPStore's client puts before every key


class Q:
    """Request codes."""

    VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
    APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS = range(9, 18)


_U8, _U32, _U64, _I64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")


def pack_bytes(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _key(key: str) -> bytes:
    return pack_bytes((WIRE_KEY_PREFIX + key).encode())


def _value(value: bytes | str) -> bytes:
    return pack_bytes(value.encode() if isinstance(value, str) else bytes(value))


class StoreConnectionLost(ConnectionError):
    """The store did not answer (connection refused, reset or closed, or no answer by the deadline);
    the connection is unusable (a late answer could be taken for the next call's)."""


class StoreConnection:
    """One client connection to a TCPStore-protocol server (``TCPStore`` itself, or :mod:`.store_server`).

    Every call takes ``deadline`` (a ``time.monotonic()`` value) and returns or raises
    :class:`StoreConnectionLost` by then. Not thread-safe: one per thread."""

    def __init__(self, host: str, port: int, deadline: float) -> None:
        self.host, self.port = host, int(port)
        try:
            self._sock = socket.create_connection((host, self.port), timeout=_left(deadline))
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise StoreConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        nonce = int.from_bytes(os.urandom(4), "little")
        self._send(_U8.pack(Q.VALIDATE) + _U32.pack(MAGIC) + _U8.pack(Q.PING) + _U32.pack(nonce), deadline)
        if _U32.unpack(self._recv(4, deadline))[0] != nonce:
            self.close()
            raise StoreConnectionLost(f"{host}:{port} is not a TCPStore (a wrong answer to ping)")

    # -- calls ------------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str, deadline: float) -> None:
        self._send(_U8.pack(Q.SET) + _key(key) + _value(value), deadline)

    def get(self, key: str, deadline: float) -> bytes:
        """The value at ``key``; waits (polling) for it up to ``deadline`` like ``Store.get``
        (``KeyError`` then; the connection stays usable)."""
        while not self.check([key], deadline):
            if time.monotonic() + 0.01 > deadline:
                raise KeyError(key)
            time.sleep(0.005)
        self._send(_U8.pack(Q.GET) + _key(key), deadline)
        return self._recv_bytes(deadline)

    def check(self, keys: list[str], deadline: float) -> bool:
        self._send(_U8.pack(Q.CHECK) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys), deadline)
        return _U8.unpack(self._recv(1, deadline))[0] == 0

    def multi_get(self, keys: list[str], deadline: float) -> list[bytes]:
        """The values of ``keys`` in one round trip (callers check that they exist first: a server may
        answer an absent key with an empty value, as weightbridge's does, or wait for it)."""
        self._send(_U8.pack(Q.MULTI_GET) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys), deadline)
        return [self._recv_bytes(deadline) for _ in keys]

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str, deadline: float) -> bytes:
        self._send(_U8.pack(Q.COMPARE_SET) + _key(key) + _value(expected) + _value(desired), deadline)
        return self._recv_bytes(deadline)

    def add(self, key: str, amount: int, deadline: float) -> int:
        self._send(_U8.pack(Q.ADD) + _key(key) + _I64.pack(int(amount)), deadline)
        return _I64.unpack(self._recv(8, deadline))[0]

    def delete_key(self, key: str, deadline: float) -> bool:
        self._send(_U8.pack(Q.DELETE_KEY) + _key(key), deadline)
        return _I64.unpack(self._recv(8, deadline))[0] > 0

    def num_keys(self, deadline: float) -> int:
        self._send(_U8.pack(Q.GETNUMKEYS), deadline)
        return _I64.unpack(self._recv(8, deadline))[0]

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    # -- bytes --------------------------------------------------------------------------------
    def _send(self, data: bytes, deadline: float) -> None:
        try:
            self._sock.settimeout(_left(deadline))
            self._sock.sendall(data)
        except OSError as exc:  # socket.timeout included
            self.close()
            raise StoreConnectionLost(f"{self.host}:{self.port}: {type(exc).__name__}: {exc}") from exc

    def _recv(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        try:
            while len(out) < n:
                self._sock.settimeout(_left(deadline))
                chunk = self._sock.recv(n - len(out))
                if not chunk:
                    raise ConnectionResetError("the store closed the connection")
                out += chunk
        except OSError as exc:
            self.close()
            raise StoreConnectionLost(f"{self.host}:{self.port}: no answer ({type(exc).__name__}: {exc})") from exc
        return bytes(out)

    def _recv_bytes(self, deadline: float) -> bytes:
        return self._recv(_U64.unpack(self._recv(8, deadline))[0], deadline)


def _left(deadline: float) -> float:
    """Seconds to ``deadline`` for a socket timeout (never 0: that would mean non-blocking)."""
    return max(deadline - time.monotonic(), 0.001)


def describe(exc: Any) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
