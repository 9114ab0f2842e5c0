"""Cross-rank settings live in the spec (its hash guarantees agreement); per-process options in BridgeOptions.

``checksums``, ``receiver_dedup``, ``heartbeat_s``, ``min_instances`` (and the deadline and round size)
used to be keyword arguments of ``from_spec``, checked late (or never) at the handshake. Now they are
fields of the spec's ``sync:`` section: ranks whose specs differ in one fail the handshake on
``spec_hash``; the old keywords raise a ``TypeError`` saying where each went.
"""

from __future__ import annotations

import pickle
import time

import pytest
import torch.distributed as dist

from weightbridge.bridge import BridgeOptions, ColocatedBridge, RolloutBridge, TrainerBridge, load_spec
from weightbridge.errors import HandshakeMismatch
from weightbridge.spec.errors import SpecErrors
from weightbridge.tensors import materialize

from sync_fakes import StoreDataPlane
from sync_harness import Threads, canonical, rollout_bridge, spec_text, trainer_bridge

ONE_INSTANCE = "{preset: vllm, instances: 1, mesh: {tp: 2}}"

MOVED_TO_SPEC = {  # sync field -> a value other than the default
    "checksums": False,  # on by default
    "receiver_dedup": "on",
    "heartbeat_s": 0.5,
    "min_instances": 1,
    "staging": True,
}


@pytest.mark.parametrize("field", sorted(MOVED_TO_SPEC))
def test_every_setting_ranks_must_agree_on_is_in_the_spec_hash(field):
    base = load_spec(spec_text())
    other = load_spec(spec_text(**{field: MOVED_TO_SPEC[field]}))
    assert getattr(other.sync, field) == MOVED_TO_SPEC[field]
    assert other.spec_hash != base.spec_hash


def test_two_ranks_whose_specs_differ_only_in_checksums_fail_the_handshake_on_the_spec_hash():
    same = load_spec(spec_text(mode="sync", timeout_s=5, rollout=ONE_INSTANCE))
    odd = load_spec(spec_text(mode="sync", timeout_s=5, rollout=ONE_INSTANCE, checksums=False))
    T = Threads()
    rollouts = [rollout_bridge(r, i, T.store, staging=True) for i, r in enumerate((same, odd))]
    trainers = [trainer_bridge(same, t, T.store)[0] for t in range(2)]
    try:
        for t, b in enumerate(trainers):
            T.start(f"t{t}", b.push, 1)
        errors = [T.exception(f"t{t}", timeout=20) for t in range(2)]
        for b, _ in rollouts:  # the receive thread kept its error for poll()
            errors.append(_poll_error(b))
    finally:
        for b, _ in rollouts:
            b.close()
        for b in trainers:
            b.close()
        T.close()
    for e in errors:
        assert isinstance(e, HandshakeMismatch), e
        assert e.field == "spec_hash", e
        assert "rollout 1" in str(e), e  # the odd rank is named on every rank
    assert odd.spec_hash in str(errors[0]) and same.spec_hash in str(errors[0])


def _poll_error(bridge, timeout_s: float = 10.0) -> BaseException | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            bridge.poll()
        except Exception as exc:  # noqa: BLE001 - returned for the test to check
            return exc
        time.sleep(0.01)
    return None


@pytest.mark.parametrize("name,value,hint", [
    ("checksums", True, "sync.checksums"),
    ("receiver_dedup", "off", "sync.receiver_dedup"),
    ("heartbeat_s", 0.05, "sync.heartbeat_s"),
    ("timeout_s", 5.0, "sync.timeout_s"),
    ("round_bytes", 1 << 20, "sync.round_bytes"),
    ("min_instances", 1, "sync.min_instances"),
    ("prefix", "wb2", "BridgeOptions(prefix="),
    ("on_round", print, "BridgeOptions(on_round="),
    ("data_plane", None, "BridgeOptions(data_plane="),
])
def test_the_old_per_process_keywords_raise_a_type_error_saying_where_they_went(name, value, hint):
    r = load_spec(spec_text(rollout=ONE_INSTANCE))
    store = dist.HashStore()
    for cls, side in ((TrainerBridge, r.trainer), (RolloutBridge, r.rollout)):
        tensors = materialize(side.ranks[0], canonical(r, 0))
        with pytest.raises(TypeError) as info:
            cls.from_spec(r, rank=0, tensors=tensors, store=store, **{name: value})
        assert f"{cls.__name__}.from_spec()" in str(info.value) and hint in str(info.value), info.value
    assert not store.check(["wb/join/trainer/0"])  # refused before joining
    with pytest.raises(TypeError, match="sync.round_bytes"):
        ColocatedBridge.from_spec(r, trainer={}, rollout={}, round_bytes=1 << 20)


@pytest.mark.parametrize("mode,spec_staging,rank_staging,expected", [
    ("sync", None, None, False),  # sync: in place
    ("async", None, None, True),  # async: a staging copy
    ("colocated", None, None, False),
    ("sync", True, None, True),  # the spec says otherwise
    ("async", False, None, False),
    ("async", None, False, False),  # one rank says otherwise
    ("sync", False, True, True),
])
def test_staging_follows_the_mode_unless_the_spec_or_the_rank_says_otherwise(mode, spec_staging, rank_staging,
                                                                              expected):
    extra = {} if spec_staging is None else {"staging": spec_staging}
    r = load_spec(spec_text(mode=mode, rollout=ONE_INSTANCE, **extra))
    tensors = materialize(r.rollout.ranks[0], canonical(r, 0))
    b = RolloutBridge.from_spec(r, rank=0, tensors=tensors, store=dist.HashStore(), staging=rank_staging,
                                options=BridgeOptions(data_plane=StoreDataPlane()))
    try:
        assert b.staging is expected and (b.staging_tensors is not None) is expected
    finally:
        b.close()


def test_the_spec_settings_reach_the_bridge():
    r = load_spec(spec_text(rollout="{preset: vllm, instances: 2, mesh: {tp: 2}}", heartbeat_s=0.3,
                            min_instances=1, receiver_dedup="off", checksums=True))
    assert r.sync.receiver_dedup == "off"  # a bare YAML `off` (a boolean in YAML 1.1) means "off"
    b, _ = trainer_bridge(r, 0, dist.HashStore(), options=BridgeOptions(prefix="other", data_plane=StoreDataPlane()))
    try:
        assert (b.min_instances, b.cp.heartbeat_s, b.plans.receiver_dedup, b.wire) == (1, 0.3, "off", "checksums=True")
        assert b.cp.keys.announce.startswith("other/")
    finally:
        b.close()


def test_min_instances_above_the_spec_instances_is_a_spec_problem():
    with pytest.raises(SpecErrors) as info:
        load_spec(spec_text(rollout=ONE_INSTANCE, min_instances=2))
    assert "$.sync.min_instances" in str(info.value) and "exceeds rollout.instances (1)" in str(info.value)


def test_rank_context_bridge_kwargs_carry_the_options_and_pickle():
    from weightbridge.testing.contract import FaultHook, RankContext

    ctx = RankContext(side="rollout", rank=1, ranks=(1,), world_size=2, instance=0, spec_path="s.yaml",
                      host="127.0.0.1", port=1234, prefix="wbx", timeout_s=5.0, heartbeat_s=0.25, workdir="/tmp",
                      fault=(2, 0))
    kw = ctx.bridge_kwargs()
    assert sorted(kw) == ["host", "options", "port"]
    opts = kw["options"]
    assert isinstance(opts, BridgeOptions) and opts.prefix == "wbx" and isinstance(opts.on_round, FaultHook)
    again = pickle.loads(pickle.dumps(kw))
    assert again["options"].prefix == "wbx" and again["options"].on_round.args == opts.on_round.args


def test_a_before_push_hook_that_raises_stops_the_push_before_anything_is_announced():
    """``BridgeOptions(before_push=...)`` runs at the start of every push (Megatron's deferred parameter
    all-gather: weightbridge.integrations.megatron.param_sync_hook); what it raises, push raises, and
    nothing is announced, so a second push with the hook satisfied goes through as version 1."""
    from weightbridge.errors import StaleParameters

    r = load_spec(spec_text(mode="async", trainer="{preset: fsdp2, mesh: {dp: 1}}",
                            rollout="{preset: vllm, instances: 1, mesh: {tp: 1}}"))
    threads = Threads()
    stale = [True]

    def before_push() -> None:
        if stale[0]:
            raise StaleParameters("trainer 0", "replicas stale")

    tb, _ = trainer_bridge(r, 0, threads.store, options=BridgeOptions(data_plane=StoreDataPlane("trainer 0"),
                                                                      before_push=before_push))
    rb, _ = rollout_bridge(r, 0, threads.store, staging=True)
    try:
        with pytest.raises(StaleParameters, match="replicas stale"):
            tb.push(1)
        assert tb.board.announcement() is None and tb.last_version is None
        stale[0] = False
        assert tb.push(1).version == 1
    finally:
        rb.close()
        tb.close()
        threads.close()


def test_the_root_exports_every_name_of_weightbridge_bridge_as_the_same_object():
    import weightbridge
    import weightbridge.bridge as bridge

    missing = sorted(set(bridge.__all__) - set(weightbridge.__all__))
    assert missing == []  # failed before with ['InstanceView', 'ReceiveStats']
    assert [n for n in bridge.__all__ if getattr(weightbridge, n) is not getattr(bridge, n)] == []
