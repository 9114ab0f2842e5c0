"""The init command every engine integration (vLLM, SGLang) sends its workers: sealed, data only, checked.

No engine here: the worker's checks (:class:`InitGate`, :func:`admit`) and the driver's sealing are
plain functions. The real routes are exercised with a real ``vllm serve``
(``tests/vllm_engine/test_vllm_server.py``) and a real SGLang HTTP server
(``tests/sglang_engine/test_sglang_integration.py``).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.errors import EngineMismatch, InitRefused
from weightbridge.integrations._engine import hooks
from weightbridge.integrations._engine.init_command import MAX_AGE_S, InitGate, InitPayload, Prepared, prepare
from weightbridge.sync.auth import ENV

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}}
sync: {mode: sync, timeout_s: 5}
"""


def _prepared(**kw):
    return prepare(SPEC, host="127.0.0.1", port=1234, probe="off", **kw)


def test_a_sealed_command_opens_once_and_every_change_is_refused():
    prepared = _prepared()
    sealed = prepared.sealed(instance=1)
    gate = InitGate()
    cmd = gate.open(sealed["payload"], sealed["seal"], "worker 0")
    assert (cmd.instance, cmd.port, cmd.spec, cmd.test_hook) == (1, 1234, SPEC, None)
    refusals = {
        "replay": (sealed["payload"], sealed["seal"], "a replay"),
        "unsealed": (prepared.sealed()["payload"], None, "not sealed with the job secret"),
        "forged": (prepared.sealed()["payload"], "ab" * 16, "does not verify"),
        "changed": (sealed["payload"].replace('"port":1234', '"port":4321'), sealed["seal"], "does not verify"),
        "not text": ({"spec": SPEC}, sealed["seal"], "must be text"),
    }
    for case, (payload, seal, why) in refusals.items():
        with pytest.raises(InitRefused, match=why) as info:
            gate.open(payload, seal, "worker 0")
        assert info.value.rank == "worker 0", case
    assert gate.open(**prepared.sealed(), me="worker 0").instance == 0  # a fresh genuine command is still good


def test_a_command_sealed_with_another_secret_is_refused(monkeypatch):
    prepared = _prepared()
    sealed = prepared.sealed()
    monkeypatch.setenv(ENV, "another-secret-0123456789")
    with pytest.raises(InitRefused, match="does not verify"):
        InitGate().open(sealed["payload"], sealed["seal"], "w")


def test_commands_from_outside_the_freshness_window_are_refused(monkeypatch):
    from weightbridge.integrations._engine import init_command

    prepared = _prepared()
    now = init_command.time.time()
    for skew in (-MAX_AGE_S - 60, MAX_AGE_S + 60):
        monkeypatch.setattr(init_command.time, "time", lambda skew=skew: now + skew)
        sealed = prepared.sealed()
        monkeypatch.undo()
        with pytest.raises(InitRefused, match="from now by the driver's clock"):
            InitGate().open(sealed["payload"], sealed["seal"], "w")


def test_an_engine_without_a_secret_cannot_verify_and_accepts_with_a_warning(monkeypatch, caplog):
    prepared = _prepared()
    monkeypatch.delenv(ENV)
    gate = InitGate()
    for _ in range(2):
        assert gate.open(prepared.sealed()["payload"], None, "w").port == 1234
    assert sum("accepting init commands unverified" in r.message for r in caplog.records) == 1


def test_the_driver_seals_with_the_job_secret_or_says_how_to_provide_one(monkeypatch):
    from weightbridge.errors import AuthError

    monkeypatch.delenv(ENV)
    with pytest.raises(AuthError, match="WEIGHTBRIDGE_SECRET"):
        _prepared()
    off = prepare(SPEC.replace("timeout_s: 5}", "timeout_s: 5, auth: off}"), host="h", port=1, probe="off")
    assert off.signer is None and off.sealed()["seal"] is None


@settings(max_examples=300, deadline=None)
@given(payload=st.one_of(st.text(max_size=200), st.dictionaries(st.text(max_size=12), st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    max_size=8).map(json.dumps)), seal=st.one_of(st.none(), st.text(max_size=40), st.integers()))
def test_any_hostile_command_is_refused_typed(payload, seal):
    """Whatever arrives (garbage, JSON of any shape, any seal) is refused with InitRefused."""
    with pytest.raises(InitRefused):
        InitGate().open(payload, seal, "w")


@settings(max_examples=100, deadline=None)
@given(fields=st.fixed_dictionaries({}, optional={
    "port": st.one_of(st.integers(), st.text(max_size=5), st.booleans()),
    "instance": st.one_of(st.integers(), st.floats(allow_nan=False)), "probe": st.text(max_size=6),
    "prefix": st.text(max_size=5), "timeout_s": st.one_of(st.floats(), st.integers()),
    "test_hook": st.one_of(st.none(), st.text(max_size=5), st.fixed_dictionaries({"name": st.text(max_size=8)})),
    "evil": st.text(max_size=5)}))
def test_a_sealed_command_is_still_validated_field_by_field(fields):
    """A genuine seal over a malformed payload (a driver bug, another version) is refused, not run."""
    from weightbridge.sync.auth import signer_from_env

    base = {"spec": SPEC, "host": "h", "port": 1, "nonce": "0" * 32, "issued_at": __import__("time").time()}
    text = json.dumps({**base, **fields})
    seal = signer_from_env().mac(b"wb-engine-init\x00", text.encode()).hex()
    try:
        cmd = InitGate().open(text, seal, "w")
    except InitRefused:
        return
    assert isinstance(cmd, InitPayload) and "evil" not in fields


def test_only_registered_hooks_reach_workers_and_only_where_enabled(monkeypatch):
    from weightbridge.testing.contract import FaultHook

    fault = FaultHook("127.0.0.1", 29500, "wbx", 5.0, 2, 0)
    ref = hooks.describe(fault)
    assert ref.name == "suite.kill-after-round" and json.loads(ref.model_dump_json())["params"]["prefix"] == "wbx"
    with pytest.raises(ValueError, match="cannot reach the engine's worker processes"):
        hooks.describe(print)
    with pytest.raises(ValueError, match="registered test hooks"):
        _prepared(options=__import__("weightbridge").BridgeOptions(on_round=lambda i: None))
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV, raising=False)
    with pytest.raises(InitRefused, match="does not enable test hooks"):
        hooks.build(ref, "w")
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, "1")
    built = hooks.build(ref, "w")
    assert type(built) is FaultHook and built.args == fault.args
    for bad in (hooks.HookRef(name="os:system", params={"command": "id"}),
                hooks.HookRef(name="suite.kill-after-round", params={"cmd": "id"})):
        with pytest.raises(InitRefused):
            hooks.build(bad, "w")


def test_admission_checks_the_engine_mesh_and_names_the_worker(monkeypatch):
    from weightbridge.integrations._engine.joining import admit
    from weightbridge.testing.contract import FaultHook

    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, "1")
    prepared = _prepared(options=__import__("weightbridge").BridgeOptions(
        prefix="p1", on_round=FaultHook("h", 1, "p1", 5.0, 1, 0)))
    gate = InitGate()
    ok = admit(gate, **prepared.sealed(instance=1), me="w", engine="vLLM", index=1, mesh={"tp": 2, "pp": 1},
               world=2, worker="vLLM worker 1")
    assert (ok.layout.rank, ok.cmd.prefix, ok.timeout_s) == (3, "p1", 5.0)
    assert ok.me == "rollout 3 (instance 1, vLLM worker 1)"
    assert type(ok.on_round) is FaultHook
    with pytest.raises(EngineMismatch, match=r"does not match this vLLM engine \(tp 4, pp 1, 4 workers\)"):
        admit(gate, **prepared.sealed(), me="w", engine="vLLM", index=0, mesh={"tp": 4, "pp": 1}, world=4, worker="x")


def test_the_payload_never_carries_the_secret():
    prepared = _prepared(options=__import__("weightbridge").BridgeOptions(secret="a-secret-only-the-job-knows"))
    sealed = prepared.sealed()
    assert "a-secret-only-the-job-knows" not in json.dumps(sealed)
    assert set(json.loads(sealed["payload"])) == set(InitPayload.model_fields)


def test_prepared_fields_are_checked_in_the_driver():
    with pytest.raises(ValueError, match="probe"):
        prepare(SPEC, host="h", port=1, probe="sometimes")
    with pytest.raises(ValueError, match="instance 2 outside"):
        prepare(SPEC, host="h", port=1, instance=2)
    with pytest.raises(ValueError):
        Prepared(None, {"spec": SPEC, "host": "h", "port": 70000}, 5.0, "wb", None).sealed()


def test_drivers_refuse_timeout_s_as_from_spec_does_saying_it_moved_to_the_spec():
    """``timeout_s=`` moved to the spec (``sync.timeout_s``): every driver refuses it with the same hint as
    ``RolloutBridge.from_spec``, before it reaches an engine (none is given here: a refusal touches none)."""
    import asyncio
    from types import SimpleNamespace

    from weightbridge.bridge import RolloutBridge
    from weightbridge.integrations.sglang.driver import SGLangWeightSync
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.integrations.vllm.protocol import BACKEND
    from weightbridge.integrations.vllm.server import VLLMServers

    config = SimpleNamespace(weight_transfer_config=SimpleNamespace(backend=BACKEND))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))
    kw = {"host": "127.0.0.1", "port": 1, "probe": "off", "timeout_s": 5.0}
    calls = {
        "VLLMWeightSync": lambda: VLLMWeightSync(llm, SPEC, **kw),
        "AsyncVLLMWeightSync.create": lambda: asyncio.run(
            AsyncVLLMWeightSync.create(SimpleNamespace(vllm_config=config), SPEC, **kw)),
        "VLLMServers": lambda: VLLMServers(["http://127.0.0.1:9", "http://127.0.0.1:9"], SPEC, **kw),
        "SGLangWeightSync": lambda: SGLangWeightSync("http://127.0.0.1:9", SPEC, **kw),
        "from_spec": lambda: RolloutBridge.from_spec(SPEC, rank=0, tensors=None, timeout_s=5.0),
    }
    for where, call in calls.items():
        with pytest.raises(TypeError) as info:
            call()
        assert f"{where}() got unexpected keyword argument(s): timeout_s= (set sync.timeout_s in the spec)" in str(
            info.value), where
