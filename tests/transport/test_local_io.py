"""RecordIO.wait's liveness rule: a peer that wrote what was waited for and then exited is not a failure."""

from __future__ import annotations

import pytest

from weightbridge.sync.roster import Roster
from weightbridge.transport.errors import PeerDisconnected
from weightbridge.transport.local_io import RecordIO


class _Store:  # a unit helper: the real store's peek is covered by the multiprocess plane tests
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def peek(self, key: str) -> bytes | None:
        return self.values.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value


def _io(store: _Store) -> RecordIO:
    return RecordIO(store, None, me=0, roster=Roster(2, (0,), (0,)), timeout_s=5)


def test_a_peer_that_acks_and_exits_between_the_poll_and_the_liveness_check_is_not_reported_dead():
    store, polls = _Store(), []

    def ready() -> bytes | None:
        polls.append(1)
        return store.peek("ack")

    def alive(peer: int) -> bool:
        # the peer writes its ack and exits right after the first (empty) poll
        store.set("ack", b"done")
        return False

    assert _io(store).wait(ready, what="the ack", peers=[1], round_index=0, alive=alive) == b"done"
    assert len(polls) == 2


def test_a_peer_that_exits_without_writing_fails_the_wait_typed_naming_it():
    store = _Store()
    with pytest.raises(PeerDisconnected) as info:
        _io(store).wait(lambda: store.peek("ack"), what="the ack of round 3", peers=[1], round_index=3,
                        alive=lambda p: False)
    assert info.value.peer == 1 and "the ack of round 3" in str(info.value) and "ended" in str(info.value)
