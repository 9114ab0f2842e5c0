"""The colocated data plane's control-store I/O: sealed records (:mod:`weightbridge.sync.local_records`) and
bounded waits that know when a peer died.

:class:`RecordIO` writes a record sealed with the job secret and reads one without blocking (a value
that does not open or parse reads as absent, and is remembered for the timeout message).
:meth:`RecordIO.wait` polls until a condition holds, calling the epoch's ``watch()`` (a failure a
member published, a silent or restarted member: ``PeerFailed``) and a liveness check of the peers
waited for (their segment locks: ``PeerDisconnected`` as soon as a peer's process ended), and raises
``PeerTimeout`` at the deadline: the same typed errors as the wire's waits, naming spec ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from weightbridge.errors import ForgedMessage
from weightbridge.sync.local_records import decode_record
from weightbridge.sync.roster import Roster
from weightbridge.transport.errors import PeerDisconnected, PeerTimeout, TransportError

T = TypeVar("T")
LIVENESS_S = 0.02  # how often a wait checks its peers' locks
_ABSENT = b"\x00weightbridge-absent\x00"

__all__ = ["RecordIO"]


class RecordIO:
    """One rank's sealed records on the store, and its waits (``me``: its bridge rank in ``roster``)."""

    def __init__(self, store: Any, signer: Any, *, me: int, roster: Roster, timeout_s: float,
                 watch: Callable[[], None] | None = None) -> None:
        self.store, self.signer, self.me, self.roster = store, signer, me, roster
        self.timeout_s, self.watch = float(timeout_s), watch
        self.stop = threading.Event()  # set by close(): every wait ends at once
        self.bad: dict[str, str] = {}  # key -> why its value was unreadable (for the timeout message)
        peek = getattr(store, "peek", None)
        self._peek = peek if peek is not None else self._compare_peek

    def error(self, cls: type[TransportError], peer: int | None, round_index: int | None, message: str) -> TransportError:
        return cls(self.me, peer, round_index, message, rank_name=self.roster.describe(self.me),
                   peer_name=None if peer is None else self.roster.describe(peer))

    def describe(self, b: int) -> str:
        return self.roster.describe(b)

    # -- records --------------------------------------------------------------------------------
    def put(self, key: str, record: Any) -> None:
        body = record.model_dump_json().encode()
        self.store.set(key, self.signer.seal(key, body) if self.signer is not None else body)

    def get(self, key: str, cls: type[T]) -> T | None:
        """The record under ``key``, or None (absent, or a value that is not a sealed ``cls``)."""
        raw = self._peek(key)
        if raw is None:
            return None
        try:
            body = self.signer.open(key, raw, self.roster.describe(self.me)) if self.signer is not None else raw
            rec = decode_record(body, cls)  # type: ignore[type-var]
        except (ForgedMessage, ValueError) as exc:
            self.bad[key] = f"{type(exc).__name__}: {str(exc)[:160]}"
            return None
        self.bad.pop(key, None)
        return rec  # type: ignore[return-value]

    def _compare_peek(self, key: str) -> bytes | None:
        value = self.store.compare_set(key, _ABSENT, _ABSENT)  # never matches, so never writes
        return None if value == _ABSENT else value

    # -- waits ----------------------------------------------------------------------------------
    def wait(self, ready: Callable[[], T | None], *, what: str, peers: Sequence[int], round_index: int | None,
             alive: Callable[[int], bool] | None = None, keys: Sequence[str] = ()) -> T:
        """Poll ``ready()`` until it returns a value; typed errors as the module docstring says."""
        deadline = time.monotonic() + self.timeout_s
        delay, next_live = 5e-5, 0.0
        while True:
            got = ready()
            if got is not None:
                return got
            if self.stop.is_set():
                raise self.error(TransportError, None, round_index, f"{what}: this rank's data plane was closed")
            now = time.monotonic()
            if now >= next_live:
                next_live = now + LIVENESS_S
                if alive is not None:
                    dead = next((p for p in peers if not alive(p)), None)
                    if dead is not None:
                        # a peer may write its record and exit between ready() and the check: look once more
                        got = ready()
                        if got is not None:
                            return got
                        raise self.error(PeerDisconnected, dead, round_index,
                                         f"{what}: the process of {self.describe(dead)} ended (it no longer holds "
                                         "the shared slab)")
                if self.watch is not None:
                    self.watch()
            if now > deadline:
                bad = [f"{k} ({self.bad[k]})" for k in keys if k in self.bad]
                more = f"; unreadable: {'; '.join(bad[:3])}" if bad else ""
                names = ", ".join(self.describe(p) for p in peers[:4]) or "?"
                raise self.error(PeerTimeout, peers[0] if peers else None, round_index,
                                 f"{what}: no progress from {names} within {self.timeout_s:g} s{more}")
            time.sleep(delay)
            delay = min(delay * 2, 0.002)
