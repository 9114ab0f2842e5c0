"""TrainerBridge / RolloutBridge in threads over a HashStore, bytes through the store (no Gloo).

Fast checks of the protocol: versions, modes, the staleness bound, serving the old version
until apply(), deadlines, late joiners, colocated copies. The multiprocess Gloo tests in
``test_bridge_mp.py`` cover the real data plane and killed processes.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from weightbridge.bridge import ColocatedBridge, load_spec
from weightbridge.errors import DeadlineExceeded, NothingToApply, PeerFailed
from weightbridge.tensors import materialize

from sync_harness import Threads, canonical, check, rollout_bridge, set_weights, spec_text, trainer_bridge, wait_until

ONE_INSTANCE = "{preset: vllm, instances: 1, mesh: {tp: 2}}"


def run_trainers(T, r, versions, *, completed=None, on_return=None, **kw):
    def trainer(rank):
        b, tensors = trainer_bridge(r, rank, T.store, **kw)
        out = []
        try:
            for v in versions:
                set_weights(r.trainer.ranks[rank], tensors, canonical(r, v))
                s = b.push(v)
                out.append(s)
                if rank == 0 and completed is not None:
                    completed.append(v)
                    if on_return is not None:
                        on_return(v)
        finally:
            b.close()
        return out

    for t in range(r.trainer.world_size):
        T.start(f"t{t}", trainer, t)


def rollout_loop(r, rank, store, *, staging, last, start: threading.Event | None = None, **kw):
    if start is not None:
        start.wait(20)
    b, tensors = rollout_bridge(r, rank, store, staging=staging, **kw)
    seen = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if b.poll():
                v = b.apply()
                seen.append((v, check(r, b, tensors, v)))
                if v >= last:
                    break
            time.sleep(0.001)
    finally:
        b.close()
    return seen


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_version_reaches_staged_and_in_place_receivers_bitwise(mode):
    r = load_spec(spec_text(mode=mode, timeout_s=10))
    T = Threads()
    try:
        for i in range(4):
            T.start(f"r{i}", rollout_loop, r, i, T.store, staging=i < 2, last=3)
        run_trainers(T, r, [1, 2, 3])
        pushes = [T.result("t0"), T.result("t1")]
        for i in range(4):
            seen = T.result(f"r{i}")
            assert [v for v, _ in seen] == [1, 2, 3] and all(bad == [] for _, bad in seen), seen
    finally:
        T.close()
    assert [s.version for s in pushes[0]] == [1, 2, 3]
    assert [s.new_epoch for s in pushes[0]] == [True, False, False]  # one handshake, one group
    assert {s.mode for s in pushes[0]} == {mode}


def test_async_staleness_bound_holds_and_receivers_serve_the_old_version_until_apply():
    k = 1
    r = load_spec(spec_text(mode="async", max_staleness=k, timeout_s=10, rollout=ONE_INSTANCE))
    T = Threads()
    rollouts = [rollout_bridge(r, i, T.store, staging=True) for i in range(2)]
    completed: list[int] = []
    lag: list[tuple[int, int]] = []  # (pushed version, slowest applied version) when push returned

    def slowest() -> int:
        return min(b.version or 0 for b, _ in rollouts)

    run_trainers(T, r, [1, 2, 3, 4], completed=completed, on_return=lambda v: lag.append((v, slowest())))
    try:
        for applied in range(1, 5):
            # Version `applied` lands in staging while the live weights keep the previous version.
            wait_until(lambda: all(b.poll() for b, _ in rollouts), what=f"version {applied} staged")
            wait_until(lambda: len(completed) >= applied, what=f"push({applied}) to return")
            time.sleep(0.2)  # give the trainer every chance to run ahead; the bound must stop it
            assert completed == list(range(1, applied + 1)), "push ran past the staleness bound"
            for b, tensors in rollouts:
                assert b.ready() and b.version == (applied - 1 if applied > 1 else None)
                if applied > 1:
                    assert check(r, b, tensors, applied - 1) == []  # still serving the old version
            for b, tensors in rollouts:
                assert b.apply() == applied
                assert check(r, b, tensors, applied) == []
        [T.result(f"t{t}") for t in range(2)]
    finally:
        for b, _ in rollouts:
            b.close()
        T.close()
    assert all(v - applied <= k for v, applied in lag), lag


def test_an_async_trainer_k_versions_ahead_raises_deadline_exceeded_when_receivers_never_apply():
    r = load_spec(spec_text(mode="async", max_staleness=1, timeout_s=1.0, rollout=ONE_INSTANCE))
    T = Threads()
    rollouts = [rollout_bridge(r, i, T.store, staging=True) for i in range(2)]
    run_trainers(T, r, [1, 2])
    try:
        e0, e1 = T.exception("t0", timeout=10), T.exception("t1", timeout=10)
    finally:
        for b, _ in rollouts:
            b.close()
        T.close()
    assert isinstance(e0, DeadlineExceeded)
    assert "every receiver to apply version >= 1 (max_staleness 1)" in str(e0)
    assert isinstance(e1, (PeerFailed, DeadlineExceeded))


def test_sync_push_returns_only_after_every_receiver_applied():
    r = load_spec(spec_text(mode="sync", timeout_s=10, rollout=ONE_INSTANCE))
    T = Threads()
    rollouts = [rollout_bridge(r, i, T.store, staging=True) for i in range(2)]
    completed: list[int] = []
    run_trainers(T, r, [1], completed=completed)
    try:
        wait_until(lambda: all(b.poll() for b, _ in rollouts), what="version 1 staged")
        time.sleep(0.2)
        assert completed == []
        rollouts[0][0].apply()
        time.sleep(0.2)
        assert completed == []
        rollouts[1][0].apply()
        wait_until(lambda: completed == [1], what="push(1) to return")
    finally:
        for b, _ in rollouts:
            b.close()
        T.close()


def test_a_late_instance_receives_the_current_version_on_its_first_update_in_a_new_epoch():
    r = load_spec(spec_text(mode="sync", timeout_s=10, min_instances=1))
    T = Threads()
    late = threading.Event()
    try:
        for i in range(4):
            T.start(f"r{i}", rollout_loop, r, i, T.store, staging=i % 2 == 0, last=3, start=late if i >= 2 else None)
        def after(v):  # before push(3): let the late instance connect, and wait until it has
            if v == 2:
                late.set()
                wait_until(lambda: T.store.check(["wb/join/rollout/2", "wb/join/rollout/3"]), what="late join")

        run_trainers(T, r, [1, 2, 3], completed=[], on_return=after)
        pushes = T.result("t0")
        early = [T.result(f"r{i}") for i in (0, 1)]
        joined = [T.result(f"r{i}") for i in (2, 3)]
    finally:
        T.close()
    assert [(s.version, s.epoch, s.new_epoch) for s in pushes] == [(1, 1, True), (2, 1, False), (3, 2, True)]
    for seen in early:
        assert [v for v, _ in seen] == [1, 2, 3] and all(b == [] for _, b in seen)
    for seen in joined:
        assert seen == [(3, [])]  # first update = the current version, bitwise


def test_apply_before_anything_arrived_raises_and_versions_must_increase():
    r = load_spec(spec_text(mode="sync", timeout_s=2, rollout=ONE_INSTANCE))
    T = Threads()
    rb, _ = rollout_bridge(r, 0, T.store, staging=False)
    tb, _ = trainer_bridge(r, 0, T.store)
    try:
        assert rb.poll() is False and rb.version is None and not rb.torn
        with pytest.raises(NothingToApply):
            rb.apply()
        tb.last_version = 5
        with pytest.raises(ValueError, match="versions must increase: pushed 5, then 5"):
            tb.push(5)
    finally:
        rb.close()
        tb.close()
        T.close()


def test_wrong_tensor_shapes_are_rejected_before_joining():
    r = load_spec(spec_text(rollout=ONE_INSTANCE))
    tensors = materialize(r.rollout.ranks[0], canonical(r, 0))
    tensors["model.norm.weight"] = torch.zeros(3, dtype=torch.bfloat16)
    del tensors["model.layers.0.mlp.down_proj.weight"]
    from weightbridge.bridge import RolloutBridge

    with pytest.raises(ValueError) as info:
        RolloutBridge.from_spec(r, rank=0, tensors=tensors, store=Threads().store)
    assert "missing tensor model.layers.0.mlp.down_proj.weight" in str(info.value)
    assert "model.norm.weight: spec shape [64], tensor [3]" in str(info.value)


def test_colocated_bridge_copies_plan_items_directly_bitwise_and_casts():
    r = load_spec(spec_text(mode="colocated", trainer="{preset: fsdp2, mesh: {dp: 2}, dtype: float32}"))
    trainer = {t.rank: materialize(t, canonical(r, 0)) for t in r.trainer.ranks}
    rollout = {x.rank: materialize(x, canonical(r, -1), fill=3.0) for x in r.rollout.ranks}
    bridge = ColocatedBridge.from_spec(r, trainer=trainer, rollout=rollout)
    for v in (1, 2):
        for t in r.trainer.ranks:
            set_weights(t, trainer[t.rank], canonical(r, v))
        stats = bridge.push(v)
        assert bridge.version == v and not bridge.torn and stats.mode == "colocated"
        for x in r.rollout.ranks:
            assert trainer[0]["model.norm.weight"].dtype == torch.float32
            from weightbridge.tensors import layout_mismatches

            assert layout_mismatches(x, rollout[x.rank], canonical(r, v)) == []


def test_trainer_rank_0_hosts_the_control_store_at_host_and_port():
    from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge
    from sync_fakes import StoreDataPlane

    r = load_spec(spec_text(mode="sync", timeout_s=5, rollout=ONE_INSTANCE))

    def tensors(layout, v):
        return materialize(layout, canonical(r, v))

    def fake():
        return BridgeOptions(data_plane=StoreDataPlane())

    t0 = TrainerBridge.from_spec(r, rank=0, tensors=tensors(r.trainer.ranks[0], 1), host="127.0.0.1", port=0,
                                 options=fake())
    port = t0.store.port  # port 0: the OS picked a free one, read back from the store
    t1 = TrainerBridge.from_spec(r, rank=1, tensors=tensors(r.trainer.ranks[1], 1), host="127.0.0.1", port=port,
                                 options=fake())
    rolls = [RolloutBridge.from_spec(r, rank=i, tensors=tensors(r.rollout.ranks[i], -1), host="127.0.0.1", port=port,
                                     staging=True, options=fake()) for i in range(2)]
    T = Threads()
    try:
        T.start("t1", t1.push, 1)
        T.start("t0", t0.push, 1)
        wait_until(lambda: all(b.poll() for b in rolls), what="version 1 staged")
        assert [b.apply() for b in rolls] == [1, 1]
        assert T.result("t0").version == T.result("t1").version == 1
        assert all(check(r, b, b.tensors, 1) == [] for b in rolls)
    finally:
        for b in (*rolls, t1, t0):
            b.close()
        T.close()


def test_a_restarted_rollout_rank_rejoins_in_a_new_epoch_and_gets_the_next_version():
    r = load_spec(spec_text(mode="sync", timeout_s=10, rollout=ONE_INSTANCE))
    T = Threads()
    rollouts = [rollout_bridge(r, i, T.store, staging=True) for i in range(2)]
    gate = threading.Event()
    completed: list[int] = []
    run_trainers(T, r, [1, 2], completed=completed, on_return=lambda v: gate.wait(10))
    try:
        wait_until(lambda: all(b.poll() for b, _ in rollouts), what="version 1 staged")
        assert [b.apply() for b, _ in rollouts] == [1, 1]
        wait_until(lambda: completed == [1], what="push(1)")
        rollouts[0][0].close()  # rank 0 restarts: a new process would do exactly this
        rollouts[0] = rollout_bridge(r, 0, T.store, staging=False)
        gate.set()
        wait_until(lambda: all(b.poll() for b, _ in rollouts), what="version 2 staged")
        assert [b.apply() for b, _ in rollouts] == [2, 2]
        assert all(check(r, b, t, 2) == [] for b, t in rollouts)
        pushes = T.result("t0")
    finally:
        for b, _ in rollouts:
            b.close()
        T.close()
    assert [(s.epoch, s.new_epoch) for s in pushes] == [(1, True), (2, True)]
