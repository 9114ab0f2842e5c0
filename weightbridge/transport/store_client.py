"""The control-store client every bridge process uses: reconnects within the deadline, fails typed.

Who calls what:

* every bridge process (trainer and rollout ranks, trainer rank 0 included) opens its store
  through :func:`connect_store` inside ``from_spec`` (:func:`weightbridge.runtime.connect.connect`):
  host it (trainer rank 0 with ``sync.store: trainer0``, the default) or connect to it (everyone
  else, and every rank with ``sync.store: external``); a ``store=`` given to ``from_spec`` that is a
  ``TCPStore`` is wrapped the same way (:meth:`ReconnectingStore.around`);
* the control plane calls ``get`` / ``check`` / ``set`` / ``add`` / ``delete_key`` on it, one
  :class:`ReconnectingStore` per thread (:meth:`ReconnectingStore.clone` for another thread);
* the bridge group's rendezvous (:func:`weightbridge.transport.group.create_bridge_group`) uses
  a ``TCPStore`` client of its own (:meth:`ReconnectingStore.underlying`; the rendezvous polls);
* the store itself is the bounded server of :mod:`.store_server` (``weightbridge store``, or a child
  process of trainer rank 0 / ``open_store(is_master=True)``, :mod:`.store`).

Failure semantics. Every call returns or raises within ``timeout_s`` (the spec's ``sync.timeout_s``)
of its start, and within the bound a caller set (:meth:`ReconnectingStore.bound`: the control plane's
waits end by their deadline, its failure paths within a second). The calls speak the TCPStore
protocol themselves (:class:`~weightbridge.transport.store_wire.StoreConnection`): torch's own client
waits for an answer without any timeout, so a store host that stopped answering (stopped, or behind a
link that drops packets) held a rank for minutes. When a call fails with a connection error (the store
process died, the connection dropped, no answer in time), the client reconnects, trying every
``ATTEMPT_S``, and retries the call: ``get``, ``check``, ``set`` and ``delete_key`` are idempotent;
``add`` is retried too, so across a reconnect an increment may apply twice (the runtime never calls
``add``). When the store stays unreachable, the call raises
:class:`~weightbridge.errors.StoreUnreachable` naming the rank and ``host:port``; so does a client
that cannot connect at all (``from_spec`` while the store is gone). After that, each later call makes
one attempt of ``ATTEMPT_S`` at most (``close()`` stays quick).

A store that came back **empty** (its process was restarted: every key is lost) is detected by the
store id: the bounded server sets a random id under :data:`STORE_ID_KEY` at start (on a plain
``TCPStore`` server the first client does), and a
reconnect that finds another id, or none, raises ``StoreUnreachable(restarted=True)`` on that call
and every later one: the bridge's joins, epochs and acks are gone, so the bridge must be rebuilt
with ``from_spec`` (the rollouts keep serving the version they hold; the next push heals them).
"""

from __future__ import annotations

import contextlib
import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

from weightbridge.errors import StoreUnreachable
from weightbridge.transport.store import open_store
from weightbridge.transport.store_server import STORE_ID_KEY
from weightbridge.transport.store_wire import StoreConnection, StoreConnectionLost

__all__ = ["ABSENT", "ATTEMPT_S", "STORE_ID_KEY", "ReconnectingStore", "connect_store"]

ABSENT = b"\x00weightbridge: no such key\x00"  # what peek's compare_set answers for a missing key
ATTEMPT_S = 1.0  # the longest single connection attempt (a dead host is retried this often)
MIN_CALL_S = 0.05  # what a call gets when its bound has passed already (one quick try)


def _lost(exc: BaseException) -> bool:
    """A connection error: retried on a new connection (torch's ``DistNetworkError`` where a caller
    handed in torch clients, e.g. a test dropping the connection)."""
    if isinstance(exc, StoreConnectionLost):
        return True
    import torch.distributed as dist  # loaded already wherever a torch client is in play

    return isinstance(exc, dist.DistNetworkError)


class ReconnectingStore:
    """A control-store client that reconnects (module docstring); quacks like ``torch.distributed.Store``
    for the control plane. Not shared between threads: :meth:`clone` opens another connection."""

    def __init__(self, host: str, port: int, *, timeout_s: float, who: str, keep: Any = None,
                 store_id: bytes | None = None) -> None:
        self.host = str(host)
        self.port = int(port)
        self.timeout_s = float(timeout_s)
        self.who = str(who)
        self._keep = keep  # the hosted store this process serves (it lives as long as this client)
        self._lost: str | None = None  # set once the store came back empty: every call raises
        self._down = False  # the last call ran out of time
        self._until: float | None = None  # a caller's bound on every call (bound())
        self._store: Any = None
        self._id: bytes | None = store_id  # None until claimed (a reconnect then checks nothing)
        self._store = self._connect(time.monotonic() + self.timeout_s, None)
        if self._id is None:
            self._id = self._call("compare_set", STORE_ID_KEY, "", uuid.uuid4().hex)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def around(cls, store: Any, *, timeout_s: float, who: str) -> Any:
        """``store`` wrapped when it is a ``TCPStore`` (reconnects to its ``host:port``), else as given."""
        import torch.distributed as dist

        if isinstance(store, ReconnectingStore) or not isinstance(store, dist.TCPStore):
            return store
        return cls(store.host, store.port, timeout_s=timeout_s, who=who, keep=store)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def down(self) -> bool:
        """The last call found the store unreachable (no call since answered)."""
        return self._down or self._lost is not None

    def _unreachable(self, message: str, restarted: bool = False) -> StoreUnreachable:
        return StoreUnreachable(self.who, self.address, message, restarted=restarted)

    def _connect(self, deadline: float, cause: BaseException | None) -> StoreConnection:
        """A new connection, tried every ``ATTEMPT_S`` until ``deadline`` (``StoreUnreachable`` then)."""
        last = cause
        while True:
            now = time.monotonic()
            if now >= deadline:
                why = f" (last error: {type(last).__name__}: {str(last).splitlines()[0][:200]})" if last else ""
                raise self._unreachable(f"no answer within {self.timeout_s:g}s{why}") from last
            try:
                return StoreConnection(self.host, self.port, min(deadline, now + ATTEMPT_S))
            except StoreConnectionLost as exc:  # not there (yet)
                last = exc
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def _reconnect(self, deadline: float, cause: BaseException) -> None:
        self._store = self._connect(deadline, cause)
        try:
            current = self._store.compare_set(STORE_ID_KEY, ABSENT, ABSENT, deadline)
        except StoreConnectionLost as exc:
            self._store = None
            raise self._unreachable(f"reconnected but could not read the store id: {exc}") from exc
        if self._id is not None and current != self._id:
            self._lost = (f"the store came back without this bridge's state (store id {self._id!r}, now "
                          f"{None if current == ABSENT else current!r}: it was restarted); rebuild the bridge "
                          "with from_spec")
            raise self._unreachable(self._lost, restarted=True)

    @contextlib.contextmanager
    def bound(self, until: float) -> Iterator[None]:
        """Calls made inside return or raise by ``until`` (a ``time.monotonic()`` value), tighter bounds win."""
        outer = self._until
        self._until = until if outer is None else min(outer, until)
        try:
            yield
        finally:
            self._until = outer

    # -- calls ------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any, retry: bool = True) -> Any:
        if self._lost is not None:
            raise self._unreachable(self._lost, restarted=True)
        now = time.monotonic()
        deadline = now + (ATTEMPT_S if self._down else self.timeout_s)
        if self._until is not None:  # a caller's bound; a call past it still gets one quick try
            deadline = min(deadline, max(self._until, now + MIN_CALL_S))
        last: BaseException | None = None
        while True:
            try:
                if self._store is None:
                    self._reconnect(deadline, last or StoreConnectionLost("no connection"))
                result = getattr(self._store, name)(*args, deadline)
                self._down = False
                return result
            except StoreUnreachable:
                self._down = True
                raise
            except Exception as exc:  # noqa: BLE001 - only connection errors are retried
                if not _lost(exc):
                    raise
                last, self._store = exc, None
                if not retry or time.monotonic() >= deadline:
                    self._down = True
                    raise self._unreachable(f"{name} failed: {str(exc).splitlines()[0][:200]}") from exc

    def get(self, key: str) -> bytes:
        """The value at ``key``, waiting for it up to ``timeout_s`` (``KeyError`` then)."""
        return self._call("get", key)

    def set(self, key: str, value: bytes | str) -> None:
        self._call("set", key, value)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def add(self, key: str, value: int) -> int:
        return int(self._call("add", key, value))

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, expected, desired, retry=False)

    def num_keys(self) -> int:
        return int(self._call("num_keys"))

    def multi_get_within(self, keys: list[str], timeout_s: float) -> list[bytes] | None:
        """The values of ``keys`` (every one known to exist) in one ``MULTI_GET`` round trip, the call bounded
        by ``timeout_s``; None when one of them is gone (deleted after the caller checked). Retried like ``get``."""
        with self.bound(time.monotonic() + timeout_s):
            values = [bytes(v) for v in self._call("multi_get", list(keys))]
        return None if any(not v for v in values) else values  # sealed values are never empty

    def peek(self, key: str) -> bytes | None:
        """The value under ``key``, or None if there is none, without blocking (``get`` waits for a
        missing key). One ``compare_set`` that can never match, so it never writes; retried like ``get``."""
        value = self._call("compare_set", key, ABSENT, ABSENT)
        return None if value == ABSENT else value

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.timeout_s = timeout.total_seconds()

    def underlying(self) -> Any:
        """A ``TCPStore`` client of this store (a new connection) for the bridge group's rendezvous, whose
        backends need a torch store. ``StoreUnreachable`` when none connects within ``timeout_s``."""
        if self._lost is not None:
            raise self._unreachable(self._lost, restarted=True)
        deadline = time.monotonic() + self.timeout_s
        self._connect(deadline, None).close()  # bounded: torch's constructor overran its timeout where nothing listens
        try:
            return open_store(self.host, self.port, is_master=False, timeout_s=max(deadline - time.monotonic(), 0.1))
        except (RuntimeError, OSError) as exc:
            raise self._unreachable(f"no TCPStore client for the bridge group: {exc}") from exc

    def clone(self) -> ReconnectingStore:
        """Another client of the same store (for another thread), sharing the id and the hosted store."""
        return ReconnectingStore(self.host, self.port, timeout_s=self.timeout_s, who=self.who, keep=self._keep,
                                 store_id=self._id)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __repr__(self) -> str:
        return f"ReconnectingStore({self.address}, {self.who})"


def connect_store(host: str, port: int, *, timeout_s: float, who: str, is_master: bool = False,
                  secret: bytes | None = None) -> ReconnectingStore:
    """Host (``is_master``: a bounded store served by a child of this process, :mod:`.store_server`; its
    job pool keyed by ``secret``) or connect to the control store at ``host:port``; every failure is
    :class:`~weightbridge.errors.StoreUnreachable` naming ``who``."""
    if not is_master:
        return ReconnectingStore(host, port, timeout_s=timeout_s, who=who)
    try:
        hosted = open_store(host, port, is_master=True, timeout_s=timeout_s, secret=secret or b"")  # b"": none
    except (RuntimeError, OSError) as exc:  # e.g. the port is taken
        raise StoreUnreachable(who, f"{host}:{port}", f"cannot host the control store: {exc}") from exc
    return ReconnectingStore(host, hosted.port, timeout_s=timeout_s, who=who, keep=hosted)
