"""Bridge calls that must refuse, end or report exactly (issue 27, item 4), each checked to fail before its fix.

In threads of one process, the data plane through the store (``sync_fakes``): these are control-plane
and bridge behaviours.
"""

from __future__ import annotations

import time

import pytest
from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
from weightbridge.errors import BridgeError, DeadlineExceeded, PeerFailed
from weightbridge.sync.messages import Keys
from weightbridge.tensors import materialize

from sync_harness import Threads, canonical, rollout_bridge, spec_text, trainer_bridge

ONE_BY_ONE = {"trainer": "{preset: fsdp2, mesh: {dp: 1}}", "rollout": "{preset: vllm, instances: 1, mesh: {tp: 1}}"}


def test_a_refused_push_with_new_tensors_keeps_the_tensors_it_had():
    """``push(v, tensors=...)`` replaced the tensors before checking ``v`` or ``close()``: a refused call
    left the bridge reading tensors its caller never meant to push."""
    r = load_spec(spec_text(timeout_s=2, **ONE_BY_ONE))
    tb, tensors = trainer_bridge(r, 0, Threads().store)
    other = {name: t.clone() for name, t in tensors.items()}
    tb.last_version = 5
    with pytest.raises(ValueError, match="versions must increase"):
        tb.push(5, tensors=other)
    assert all(tb.tensors[name] is t for name, t in tensors.items())
    tb.close()
    with pytest.raises(BridgeError, match="after close"):
        tb.push(6, tensors=other)
    assert all(tb.tensors[name] is t for name, t in tensors.items())


def test_a_data_plane_without_authenticate_is_refused_not_trusted():
    """``authenticate`` was looked up with ``getattr``: a custom data plane without it silently turned the
    data-sender check off."""

    class NoSenderCheck:
        def connect(self, store, **kw):
            pass

        def run(self, plan, **kw):
            pass

        def close(self, abort=False):
            pass

    r = load_spec(spec_text(**ONE_BY_ONE))
    tensors = materialize(r.trainer.ranks[0], canonical(r, 0))
    with pytest.raises(TypeError, match="NoSenderCheck lacks authenticate"):
        TrainerBridge.from_spec(r, rank=0, tensors=tensors, store=Threads().store,
                                options=BridgeOptions(data_plane=NoSenderCheck()))


def test_deadline_exceeded_reports_the_deadline_the_wait_ran_on():
    """Trainer ranks > 0 wait up to 2 x ``timeout_s`` for trainer 0's announcement; the error said
    ``timeout_s``."""
    r = load_spec(spec_text(timeout_s=0.5, trainer="{preset: fsdp2, mesh: {dp: 2}}",
                            rollout=ONE_BY_ONE["rollout"]))
    tb, _ = trainer_bridge(r, 1, Threads().store)  # trainer 0 never comes
    try:
        t = time.monotonic()
        with pytest.raises(DeadlineExceeded) as info:
            tb.push(1)
        assert info.value.timeout_s == 1.0 and "no progress after 1s waiting for trainer 0 to announce" in str(info.value)
        assert 0.9 < time.monotonic() - t < 3.0
    finally:
        tb.close()


def test_the_staging_copy_walks_the_layout_once():
    """The staging copy rebuilt the set of every layout name once per tensor (quadratic in the tensor count;
    a model with 50k local tensors spent minutes there)."""
    r = load_spec(spec_text(mode="async", **ONE_BY_ONE))
    layout = r.rollout.ranks[0]
    walks = [0]

    class Counted(tuple):
        def __iter__(self):
            walks[0] += 1
            return super().__iter__()

    object.__setattr__(layout, "tensors", Counted(layout.tensors))  # frozen value: instrumented for this test
    try:
        b, _ = rollout_bridge(r, 0, Threads().store, staging=True)
        b.close()
    finally:
        object.__setattr__(layout, "tensors", tuple(layout.tensors))
    assert len(layout.tensors) == 16 and walks[0] <= 8, walks  # from_spec's own checks, one for the copy


def test_close_ends_a_receive_waiting_in_the_handshake_at_once():
    """``RolloutBridge.close()`` joined the receive thread (up to ``timeout_s`` + 5 s) before ending what
    that thread waited on. Here it waits in the handshake for trainer 1, who never comes; trainer 0
    hears why the rollout left."""
    r = load_spec(spec_text(mode="async", timeout_s=5, trainer="{preset: fsdp2, mesh: {dp: 2}}",
                            rollout=ONE_BY_ONE["rollout"]))
    T = Threads()
    rb, _ = rollout_bridge(r, 0, T.store, staging=True)
    tb, _ = trainer_bridge(r, 0, T.store)
    try:
        pushing = T.start("push", tb.push, 1)
        hello = Keys("wb").hello(1, "rollout/0")
        deadline = time.monotonic() + 10
        while not T.store.check([hello]) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the receive thread now waits for trainer 1's hello
        t = time.monotonic()
        rb.close()
        closed_s = time.monotonic() - t
        with pytest.raises(BridgeError) as info:
            pushing.result(timeout=20)
    finally:
        tb.close()
        T.close()
    assert closed_s < 2.0, f"close() took {closed_s:.1f}s"
    assert isinstance(info.value, PeerFailed) and info.value.message == "BridgeError: rollout 0: closed while receiving version 1"
