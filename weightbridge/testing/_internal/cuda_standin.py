"""CPU stand-ins for what a CUDA rank has: ``torch.cuda``'s streams (recorded) and a stated GPU identity.

Harness (tests, ``bench/gpu_readiness.py --dry-run``); never imported by product code.

:class:`RecordingCuda` has the surface :class:`~weightbridge.transport.streams.ExecStreams` calls
(``Stream``, ``Event``, ``current_stream``, ``stream``) with per-thread current streams as CUDA has,
and logs every record, wait and synchronisation, so a test can check the order (the executor's
stream waits for the caller's before packing; the caller's stream and the host wait for the
executor's at the end) on a machine without a GPU. It moves no data and orders nothing: on CPU every
copy is already complete when it returns. :class:`StatedIdentityPlane` states a GPU identity in the
handshake.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

from weightbridge.sync.dataplane import TransportDataPlane
from weightbridge.sync.messages import DeviceIdentity
from weightbridge.transport.identity import host_identity


class StandInStream:
    _ids = itertools.count()

    def __init__(self, api: RecordingCuda, name: str | None = None) -> None:
        self.api = api
        self.name = name or f"stream{next(self._ids)}"

    def wait_event(self, event: StandInEvent) -> None:
        self.api.log.append(("wait", self.name, event.name))

    def __repr__(self) -> str:
        return self.name


class StandInEvent:
    _ids = itertools.count()

    def __init__(self, api: RecordingCuda) -> None:
        self.api = api
        self.name = f"event{next(self._ids)}"
        self.on: str | None = None

    def record(self, stream: StandInStream) -> None:
        self.on = stream.name
        self.api.log.append(("record", stream.name, self.name))

    def synchronize(self) -> None:
        self.api.log.append(("sync", self.on, self.name))

    def query(self) -> bool:
        return True


class RecordingCuda:
    """``torch.cuda``'s stream surface on CPU; ``log`` holds ``(what, stream, event)`` in call order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str | None, str]] = []
        self.default = StandInStream(self, "default")
        self._local = threading.local()

    def Stream(self, device: Any = None) -> StandInStream:  # noqa: N802 - torch.cuda's name
        return StandInStream(self)

    def Event(self) -> StandInEvent:  # noqa: N802 - torch.cuda's name
        return StandInEvent(self)

    def current_stream(self, device: Any = None) -> StandInStream:
        return getattr(self._local, "stream", None) or self.default

    @contextlib.contextmanager
    def stream(self, stream: StandInStream) -> Iterator[None]:
        before = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before


class StatedIdentityPlane(TransportDataPlane):
    """The real Gloo data plane stating another backend and device in its hello (``stated``: the fields of a
    :class:`~weightbridge.sync.messages.DeviceIdentity` but the host, which is this one's): what a rank on
    a GPU states, on CPU. For handshakes that must refuse it, so ``connect`` (the first backend call)
    raises ``AssertionError`` if reached."""

    def __init__(self, stated: dict) -> None:
        super().__init__(transport="gloo", device="cpu")
        self.stated = dict(stated)

    def identity(self) -> DeviceIdentity:
        return DeviceIdentity(host=host_identity(), **self.stated)

    def connect(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("connect() called although the handshake should have refused this rank")


__all__ = ["RecordingCuda", "StandInEvent", "StandInStream", "StatedIdentityPlane"]
