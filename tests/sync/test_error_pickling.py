"""Typed runtime errors survive pickling (multiprocessing results, vLLM RPC) with their type and fields."""

from __future__ import annotations

import pickle

import pytest

from weightbridge.sync.errors import DeadlineExceeded, HandshakeMismatch, NothingToApply, PeerFailed, TornModelError
from weightbridge.transport.errors import ChecksumError, PeerDisconnected, PeerTimeout, TransportError

CASES = [
    PeerFailed("trainer 0", "rollout 3", "died"),
    DeadlineExceeded("rollout 1", "version 4 complete on every worker", 2.5),
    HandshakeMismatch("rollout 2", "plan_hash", "abc", "trainer 0", "def"),
    TornModelError("rollout 0", 7, 6, "in-place receive of version 7 interrupted"),
    NothingToApply("rollout 5"),
    TransportError(1, 3, 2, "boom"),
    PeerTimeout(0, 2, 1, "no data"),
    PeerDisconnected(0, None, None, "closed"),
    ChecksumError(2, 0, 4),
]


@pytest.mark.parametrize("err", CASES, ids=lambda e: type(e).__name__)
def test_round_trip_keeps_type_message_and_fields(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    fields = {k: v for k, v in vars(err).items() if k != "_init_args"}
    assert {k: v for k, v in vars(back).items() if k != "_init_args"} == fields
    assert fields  # every error carries its rank (and more) as attributes
