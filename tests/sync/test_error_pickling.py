"""Typed runtime errors survive pickling (multiprocessing results, vLLM RPC) with their type and fields."""

from __future__ import annotations

import pickle

import pytest

from weightbridge.errors import (
    AuthError,
    BadMessage,
    BridgeError,
    DeadlineExceeded,
    DeviceConflict,
    EngineMismatch,
    HandshakeMismatch,
    InitRefused,
    NothingToApply,
    PeerFailed,
    StoreUnreachable,
    ProtocolError,
    ForgedMessage,
    StaleParameters,
    TornModelError,
    error_data,
    error_from_data,
)
from weightbridge.integrations.vllm.server import ServerError
from weightbridge.transport.errors import (
    ChecksumError,
    DeltaBaseMismatch,
    MalformedBucket,
    PeerDisconnected,
    PeerTimeout,
    TransportError,
)
from weightbridge.transport.peerauth import UnauthenticatedPeer

CASES = [
    PeerFailed("trainer 0", "rollout 3", "died"),
    DeadlineExceeded("rollout 1", "version 4 complete on every worker", 2.5),
    HandshakeMismatch("rollout 2", "plan_hash", "abc", "trainer 0", "def"),
    HandshakeMismatch("rollout 2", "backend", "gloo on cpu", "trainer 0", "nccl on cuda:0", "a hint"),
    DeviceConflict("trainer 1", "rollout 0", "rollout 1", "cuda:0 (GPU-ab) of host 12"),
    TornModelError("rollout 0", 7, 6, "in-place receive of version 7 interrupted"),
    NothingToApply("rollout 5"),
    StoreUnreachable("rollout 2", "127.0.0.1:29500", "no connection within 8s", restarted=True),
    ProtocolError("rollout 1", "offer of round 3 under round 2"),
    EngineMismatch("rollout 3 (instance 1, vLLM worker 1)", "the spec's rollout mesh {'tp': 2} does not match"),
    InitRefused("SGLang worker 0", "not sealed with the job secret"),
    TransportError(1, 3, 2, "boom"),
    PeerTimeout(0, 2, 1, "no data"),
    PeerDisconnected(0, None, None, "closed"),
    ChecksumError(2, 0, 4),
    PeerTimeout(2, 0, 1, "no data", rank_name="rollout 2 (bridge rank 2)", peer_name="trainer 0 (bridge rank 0)"),
    BridgeError("rollout 1: closed while receiving version 3"),
    AuthError("sync.auth is required and no job secret was found (set WEIGHTBRIDGE_SECRET)"),
    ForgedMessage("trainer 0", "wb/ack/staged/1", "bad MAC"),
    StaleParameters("trainer 1", "overlap_param_gather: gather first"),
    BadMessage("control store", "not a valid Announce message"),
    DeltaBaseMismatch(3, 0, 1, "delta against version 4, this rank holds 3"),
    MalformedBucket(3, 1, 0, "bad header"),
    UnauthenticatedPeer(0, 2, None, "token does not verify", peer_name="rollout 1 (bridge rank 2)"),
    ServerError("http://127.0.0.1:8000", "/update_weights", 500, "Internal Server Error"),
]


def test_every_runtime_error_class_has_a_case() -> None:
    """Every class in weightbridge/ derived from ``BridgeError`` (by name, through any chain of bases) is in
    ``CASES``: a new error class without a pickling case fails here."""
    import ast
    from pathlib import Path

    import weightbridge

    bases: dict[str, set[str]] = {}
    for path in Path(weightbridge.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute)))
    errors = {"BridgeError"}
    while True:
        more = {name for name, of in bases.items() if of & errors} - errors
        if not more:
            break
        errors |= more
    assert errors == {type(e).__name__ for e in CASES}


@pytest.mark.parametrize("err", CASES, ids=lambda e: type(e).__name__)
def test_round_trip_keeps_type_message_and_fields(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    fields = {k: v for k, v in vars(err).items() if k != "_init_args"}
    assert {k: v for k, v in vars(back).items() if k != "_init_args"} == fields
    assert fields or type(err) is BridgeError  # every subclass carries its fields (its rank, ...) as attributes


@pytest.mark.parametrize("err", CASES, ids=lambda e: type(e).__name__)
def test_an_error_rebuilt_from_rpc_data_pickles_again(err: Exception) -> None:
    """vLLM's RPC carries errors as plain data (error_data); the rebuilt error must pickle like the original."""
    rebuilt = error_from_data(error_data(err))
    assert type(rebuilt) is type(err) and str(rebuilt) == str(err)
    back = pickle.loads(pickle.dumps(rebuilt))
    assert type(back) is type(err) and str(back) == str(err)
    assert vars(back) == vars(rebuilt) and vars(back).get("rank") == vars(err).get("rank")


def test_error_names_have_one_home() -> None:
    import weightbridge
    import weightbridge.bridge
    import weightbridge.sync

    for name in ("PeerFailed", "DeadlineExceeded", "HandshakeMismatch", "TornModelError", "NothingToApply"):
        assert getattr(weightbridge, name) is getattr(__import__("weightbridge.errors", fromlist=[name]), name)
        assert not hasattr(weightbridge.bridge, name) and not hasattr(weightbridge.sync, name)


def test_engine_mismatch_is_one_class_for_every_engine() -> None:
    """``except EngineMismatch`` catches the vLLM and the SGLang integration's (no engine module defines one)."""
    import ast
    from pathlib import Path

    import weightbridge.integrations as integrations

    defined = [str(path) for path in Path(integrations.__path__[0]).rglob("*.py")
               if any(isinstance(node, ast.ClassDef) and node.name in ("EngineMismatch", "InitRefused")
                      for node in ast.walk(ast.parse(path.read_text())))]
    assert defined == []
