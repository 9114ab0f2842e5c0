"""Many control-store reads in a few round trips: every wait loop's keys read as one snapshot.

A control-store read is one network round trip (``compare_set`` as a non-blocking ``get``); trainer 0
used to read every rollout rank's join record, heartbeat and ack one after the other, so a push cost
~30 (sync) to ~42 (async) sequential round trips (``bench/control_rtt.py``). :func:`read_many` reads
``n`` keys in three: one ``check`` of all of them, then, when every one exists, one ``multi_get``
(TCPStore's is two: a wait and the read); when some are absent it reads each alone (never blocks).

:func:`batch` makes the reads of a block answer from one :func:`read_many`: the
:class:`~weightbridge.sync.control.ControlPlane` serves ``get`` / ``get_raw`` / ``exists`` /
``heartbeat`` of those keys from the snapshot (values as sealed on the store: every read still
opens and checks them). A block must not wait (``wait_for`` refuses inside one: it would see the
same values forever); wait loops take a fresh batch per iteration instead, and :func:`reuse` hands
the last one to the decisions taken right after the wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol


class SnapshotReads(Protocol):
    """What a batch needs of a control plane (:class:`~weightbridge.sync.control.ControlPlane` is one):
    the store, the snapshot its reads answer from, and its bounded, typed store calls. Declared here so
    that ``control`` imports ``batch`` and not the reverse."""

    store: Any
    snapshot: dict[str, bytes | None] | None

    def exists(self, keys: Sequence[str]) -> bool: ...

    def store_call(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def peek_raw(self, key: str) -> bytes | None: ...

BATCH_MIN = 4  # fewer keys: one read each (one round trip) is cheaper than check + multi_get (three)
MULTI_GET_S = 2.0  # a key deleted between the check and the read ends the multi_get this soon (then: one read each)


def read_many(cp: SnapshotReads, keys: Sequence[str], *, all_or_none: bool = False) -> dict[str, bytes | None] | None:
    """Raw values of ``keys`` (None where absent), in three round trips when all exist.

    ``all_or_none``: when some key is absent, return None after the one ``check`` (a caller that
    needs all of them, e.g. every rank's ack, has its answer without reading any)."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return {}
    multi = getattr(cp.store, "multi_get_within", None)  # the reconnecting client's bounded multi_get
    if all_or_none or (multi is not None and len(keys) >= BATCH_MIN):
        if not cp.exists(keys):
            if all_or_none:
                return None
        elif multi is not None and len(keys) >= BATCH_MIN:
            values = cp.store_call(multi, keys, MULTI_GET_S)
            if values is not None:  # None: a key vanished after the check
                return dict(zip(keys, values))
    return {k: cp.peek_raw(k) for k in keys}


@contextlib.contextmanager
def batch(cp: SnapshotReads, keys: Sequence[str], *, all_or_none: bool = False
          ) -> Iterator[dict[str, bytes | None] | None]:
    """Within the block, ``cp``'s reads of ``keys`` answer from one :func:`read_many` (nested blocks add
    keys). ``all_or_none``: when some key is absent the block gets None and reads as usual."""
    outer = cp.snapshot
    values = read_many(cp, [k for k in keys if outer is None or k not in outer], all_or_none=all_or_none)
    if values is None:
        yield None
        return
    cp.snapshot = {**(outer or {}), **values}
    try:
        yield cp.snapshot
    finally:
        cp.snapshot = outer


@contextlib.contextmanager
def reuse(cp: SnapshotReads, snapshot: dict[str, bytes | None]) -> Iterator[None]:
    """Within the block, ``cp``'s reads of ``snapshot``'s keys answer from it (values a :func:`batch` read
    moments ago, for decisions taken right after that look)."""
    outer = cp.snapshot
    cp.snapshot = {**(outer or {}), **snapshot}
    try:
        yield
    finally:
        cp.snapshot = outer
