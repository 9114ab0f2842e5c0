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
  the current raw connection (:meth:`ReconnectingStore.underlying`);
* the ``weightbridge store`` command hosts a store in its own process with :func:`serve`.

Failure semantics. When a call fails with a connection error (``DistNetworkError``: the store
process died, the connection dropped), the client reconnects, for at most ``timeout_s`` (the spec's
``sync.timeout_s``) from that failure, trying every ``ATTEMPT_S``, and then retries the call:
``get``, ``check``, ``set`` and ``delete_key`` are idempotent; ``add`` is retried too, so across a
reconnect an increment may apply twice (the runtime's counters, heartbeats and failure numbering,
tolerate a skipped value). When the store stays unreachable, the call raises
:class:`~weightbridge.errors.StoreUnreachable` naming the rank and ``host:port``; so does a client
that cannot connect at all (``from_spec`` while the store is gone).

A store that came back **empty** (its process was restarted: every key is lost) is detected by the
store id: the first client (or :func:`serve`) stores a random id under :data:`STORE_ID_KEY`, and a
reconnect that finds another id, or none, raises ``StoreUnreachable(restarted=True)`` on that call
and every later one: the bridge's joins, epochs and acks are gone, so the bridge must be rebuilt
with ``from_spec`` (the rollouts keep serving the version they hold; the next push heals them).
"""

from __future__ import annotations

import datetime
import socket
import time
import uuid
from typing import Any

import torch.distributed as dist

from weightbridge.errors import StoreUnreachable
from weightbridge.transport.store import open_store

__all__ = ["ABSENT", "ATTEMPT_S", "STORE_ID_KEY", "ReconnectingStore", "connect_store", "serve"]

STORE_ID_KEY = "weightbridge/store-id"
ABSENT = b"\x00weightbridge: no such key\x00"  # what peek's compare_set answers for a missing key
ATTEMPT_S = 1.0  # the longest single connection attempt (a dead host is retried this often)
_RETRIED = ("get", "check", "set", "add", "delete_key")


def _is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, dist.DistNetworkError)


def _probe(host: str, port: int, timeout_s: float) -> None:
    """One plain TCP connect to ``host:port`` within ``timeout_s`` (``OSError`` when nothing listens).

    Why: ``TCPStore``'s client constructor retries with backoff and overran its own timeout by
    seconds when nothing listened (3.3 s for 1 s, seen in CI), so a reconnect would break the
    deadline it promises. A refused or silent port is found here, within the wall time asked for;
    only a listening store is handed to the constructor."""
    with socket.create_connection((host, port), timeout=max(timeout_s, 0.001)):
        pass


class ReconnectingStore:
    """A ``TCPStore`` client that reconnects (module docstring); quacks like ``torch.distributed.Store``
    for the control plane. Not shared between threads: :meth:`clone` opens another connection."""

    def __init__(self, host: str, port: int, *, timeout_s: float, who: str, client: Any = None,
                 keep: Any = None, store_id: bytes | None = None) -> None:
        self.host = str(host)
        self.port = int(port)
        self.timeout_s = float(timeout_s)
        self.who = str(who)
        self._keep = keep  # the hosting TCPStore of this process (its server lives as long as it)
        self._lost: str | None = None  # set once the store came back empty: every call raises
        self._down = False  # the last reconnect ran out of time
        self._store: Any = client
        self._id: bytes | None = store_id  # None until claimed (a reconnect then checks nothing)
        if self._store is None:
            self._store = self._connect(time.monotonic() + self.timeout_s, None)
        if self._id is None:
            self._id = self._claim_id()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def around(cls, store: Any, *, timeout_s: float, who: str) -> Any:
        """``store`` wrapped when it is a ``TCPStore`` (reconnects to its ``host:port``), else as given."""
        if isinstance(store, ReconnectingStore) or not isinstance(store, dist.TCPStore):
            return store
        return cls(store.host, store.port, timeout_s=timeout_s, who=who, client=store, keep=store)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _unreachable(self, message: str, restarted: bool = False) -> StoreUnreachable:
        return StoreUnreachable(self.who, self.address, message, restarted=restarted)

    def _connect(self, deadline: float, cause: BaseException | None) -> Any:
        """A new client connection, tried until ``deadline`` (``StoreUnreachable`` then)."""
        last = cause
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                why = f" (last error: {type(last).__name__}: {str(last).splitlines()[0][:200]})" if last else ""
                raise self._unreachable(f"no connection within {self.timeout_s:g}s{why}") from last
            try:
                _probe(self.host, self.port, min(remaining, ATTEMPT_S))
                client = open_store(self.host, self.port, is_master=False, timeout_s=min(remaining, ATTEMPT_S))
                client.set_timeout(datetime.timedelta(seconds=self.timeout_s))
                return client
            except (RuntimeError, OSError) as exc:  # DistNetworkError / DistStoreError: not there (yet)
                last = exc
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def _claim_id(self) -> bytes:
        """The store's id (set by the first client or by :func:`serve`); retried like any call."""
        return self._call("compare_set", STORE_ID_KEY, "", uuid.uuid4().hex, retry=True)

    def _reconnect(self, deadline: float, cause: BaseException) -> None:
        self._store = self._connect(deadline, cause)
        try:
            current = self._store.get(STORE_ID_KEY) if self._store.check([STORE_ID_KEY]) else None
        except RuntimeError as exc:
            self._store = None
            raise self._unreachable(f"reconnected but could not read the store id: {exc}") from exc
        if self._id is not None and current != self._id:
            self._lost = (f"the store came back without this bridge's state (store id {self._id!r}, now "
                          f"{current!r}: it was restarted); rebuild the bridge with from_spec")
            raise self._unreachable(self._lost, restarted=True)

    # -- calls ------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any, retry: bool = True) -> Any:
        if self._lost is not None:
            raise self._unreachable(self._lost, restarted=True)
        deadline: float | None = None
        while True:
            try:
                if self._store is None:
                    raise dist.DistNetworkError("no connection (an earlier reconnect failed)")
                return getattr(self._store, name)(*args)
            except RuntimeError as exc:
                if not _is_connection_error(exc):
                    raise  # e.g. DistStoreError: a get timed out on a missing key (the store is up)
                if not retry:
                    raise self._unreachable(f"{name} failed: {exc}") from exc
                self._store = None
                if deadline is None:  # the budget runs from the first failure of this call; once a
                    # call ran out of it, later ones make one attempt each (close() stays quick)
                    deadline = time.monotonic() + (ATTEMPT_S if self._down else self.timeout_s)
                try:
                    self._reconnect(deadline, exc)
                except StoreUnreachable:
                    self._down = True
                    raise
                self._down = False

    def get(self, key: str) -> bytes:
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

    def multi_get_within(self, keys: list[str], timeout_s: float) -> list[bytes] | None:
        """The values of ``keys`` (every one known to exist) in one ``multi_get``; None when one does not
        exist within ``timeout_s`` (deleted after the caller checked). Retried like ``get``."""
        if self._store is not None:
            self._store.set_timeout(datetime.timedelta(seconds=timeout_s))
        try:
            return [bytes(v) for v in self._call("multi_get", list(keys))]
        except dist.DistStoreError:  # the wait for a missing key timed out (the connection is fine)
            return None
        finally:
            if self._store is not None:
                self._store.set_timeout(datetime.timedelta(seconds=self.timeout_s))

    def peek(self, key: str) -> bytes | None:
        """The value under ``key``, or None if there is none, without blocking (``get`` waits for a
        missing key until the store's timeout; a key deleted between ``check`` and ``get`` did that).
        One ``compare_set`` that can never match, so it never writes; retried like ``get``."""
        value = self._call("compare_set", key, ABSENT, ABSENT)
        return None if value == ABSENT else value

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.timeout_s = timeout.total_seconds()
        if self._store is not None:
            self._store.set_timeout(timeout)

    def underlying(self) -> Any:
        """The current raw ``TCPStore`` connection (reconnecting first if the last one failed)."""
        if self._lost is not None:
            raise self._unreachable(self._lost, restarted=True)
        if self._store is None:
            self._reconnect(time.monotonic() + self.timeout_s, dist.DistNetworkError("no connection"))
        return self._store

    def clone(self) -> ReconnectingStore:
        """Another client of the same store (for another thread), sharing the id and the hosting store."""
        client = None
        if self._store is not None:
            try:
                client = self._store.clone()
            except RuntimeError:
                client = None
        return ReconnectingStore(self.host, self.port, timeout_s=self.timeout_s, who=self.who, client=client,
                                 keep=self._keep, store_id=self._id)

    def __repr__(self) -> str:
        return f"ReconnectingStore({self.address}, {self.who})"


def connect_store(host: str, port: int, *, timeout_s: float, who: str, is_master: bool = False) -> ReconnectingStore:
    """Host (``is_master``: this process serves the store) or connect to the control store at
    ``host:port``; every failure is :class:`~weightbridge.errors.StoreUnreachable` naming ``who``."""
    if not is_master:
        return ReconnectingStore(host, port, timeout_s=timeout_s, who=who)
    try:
        master = open_store(host, port, is_master=True, timeout_s=timeout_s)
    except (RuntimeError, OSError) as exc:  # e.g. the port is taken
        raise StoreUnreachable(who, f"{host}:{port}", f"cannot host the control store: {exc}") from exc
    return ReconnectingStore(host, master.port, timeout_s=timeout_s, who=who, client=master, keep=master)


def serve(host: str, port: int, *, timeout_s: float = 300.0) -> tuple[Any, str]:
    """Host a control store in this process (``weightbridge store``); returns (the master store, its id).

    The store lives as long as the returned object. Its id (:data:`STORE_ID_KEY`) lets clients
    tell a restarted (empty) store from a dropped connection. ``StoreUnreachable`` when ``host:port``
    cannot be bound.
    """
    try:
        master = open_store(host, port, is_master=True, timeout_s=timeout_s)
    except (RuntimeError, OSError) as exc:
        raise StoreUnreachable("weightbridge store", f"{host}:{port}", f"cannot host the control store: {exc}") from exc
    sid = master.compare_set(STORE_ID_KEY, "", uuid.uuid4().hex)
    return master, sid.decode() if isinstance(sid, bytes) else str(sid)
