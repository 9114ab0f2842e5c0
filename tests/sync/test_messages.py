"""Control messages: JSON round trips, typed decoding, the key layout."""

from __future__ import annotations

import pytest

from weightbridge.errors import BadMessage, BridgeError
from weightbridge.sync.messages import Ack, Announce, Failure, Hello, Join, Keys, Membership, decode, encode


def test_every_message_round_trips_through_json_without_pickle():
    msgs = [
        Join(side="rollout", rank=3, instance=1, nonce="n", pid=7, host="h"),
        Membership(epoch=2, num_trainers=2, instances=(0, 1), rollout_ranks=(0, 1, 2, 3), reason="first push"),
        Hello(side="trainer", rank=0, epoch=2, spec_hash="s", plan_hash="p", dtypes="d", dtype_diffs=("x",), nonce="n"),
        Announce(seq=5, version=9, epoch=2),
        Ack(rank=1, version=9, seq=5, epoch=2, stage="staged"),
        Failure(side="rollout", rank=1, epoch=2, error="ValueError", message="boom"),
    ]
    for m in msgs:
        data = encode(m)
        assert data.startswith(b"{") and b'"kind"' in data
        assert decode(data, type(m)) == m


def test_decode_rejects_another_message_kind_garbage_and_huge_values_typed():
    data = encode(Announce(seq=1, version=1, epoch=1))
    with pytest.raises(BadMessage, match="expected a Ack message, got Announce"):
        decode(data, Ack)
    with pytest.raises(BadMessage, match="not a valid Announce message"):
        decode(b'{"kind": "announce", "seq": "x"}', Announce)
    with pytest.raises(BadMessage, match="not a valid Announce message"):
        decode(b"\x80\x04K\x01.", Announce)  # a pickle is not a message
    with pytest.raises(BadMessage, match="5242880-byte value is not a Announce message"):
        decode(b" " * (5 << 20), Announce)  # rejected before parsing
    assert isinstance(BadMessage("x", "y"), BridgeError)


def test_key_layout_is_namespaced_by_prefix_and_epoch():
    k = Keys("wb-x/")
    assert k.join("rollout/3") == "wb-x/join/rollout/3"
    assert k.hello(4, "trainer/0") == "wb-x/e4/hello/trainer/0"
    assert k.failure(4, 2) == "wb-x/e4/fail/2"
    assert k.group_prefix(4) == "wb-x/e4/pg"
    assert k.ack("applied", 5) == "wb-x/ack/applied/5"
    assert k.announce == "wb-x/ann" and k.epoch == "wb-x/epoch"
