"""The SGLang driver's, commands' and worker entry point's own logic, without SGLang (fake client).

The real paths run in ``test_sglang_integration.py`` (real SGLang engines, CI's SGLang phase).
"""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.errors import DeadlineExceeded, error_data
from weightbridge.integrations.sglang.commands import (
    PREFIX,
    Command,
    CommandError,
    decode,
    encode,
    read_reply,
    write_reply,
)
from weightbridge.sync.messages import Ack, Keys
from weightbridge.sync.messages import encode as encode_message
from weightbridge.transport.store import open_store

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: sglang, instances: 1, mesh: {tp: 2}}
sync: {mode: sync, timeout_s: 5}
"""


_STORES: list = []  # kept alive: a freed port reused by the next test's store would meet the last test's readers


def _store():
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    _STORES.append(store)
    return store


def _ack(store, rank: int, version: int) -> None:
    """An ack as a rollout rank writes it: sealed with the job secret (tests/conftest.py sets one)."""
    from weightbridge.sync.auth import signer_from_env

    key = Keys("wb").ack("applied", rank)
    store.set(key, signer_from_env().seal(key, encode_message(Ack(rank=rank, version=version, seq=version, epoch=1,
                                                                         stage="applied"))))
    store.check([key])  # set sends no reply: return once the store has it, as Board.ack does


class FakeClient:
    """The client interface of SGLangWeightSync; its 'workers' answer as scripted."""

    tp_size = 2
    where = "fake SGLang"

    def __init__(self, store, applies: int | None = None, error: BaseException | None = None) -> None:
        self.store, self.applies, self.error = store, applies, error
        self.refuse: str | None = None  # SGLang answers success=False with this message (after the workers ran)
        self.label: str | None = "default"
        self.calls: list[tuple] = []

    def begin(self):
        self.calls.append(("begin",))
        return True, "Success"

    def end(self):
        self.calls.append(("end",))
        return True, "Success"

    def load(self, data: bytes, *, flush_cache: bool, weight_version: str | None):
        [(name, tensor)] = pickle.loads(data)
        assert tensor.numel() == 0
        cmd = decode(name)
        self.calls.append(("load", cmd.op, weight_version))
        if weight_version is not None:  # SGLang records the label of a successful call
            self.label = weight_version
        for tp in range(self.tp_size):
            reply = {"op": cmd.op, "error": None}
            if cmd.op == "update":
                if self.error is not None:
                    reply["error"] = error_data(self.error)
                else:
                    reply["version"] = self.applies if self.applies is not None else cmd.version
            if cmd.reply_dir:
                write_reply(cmd.reply_dir, cmd.seq, tp, reply)
        if self.refuse is not None:
            return False, self.refuse
        return True, "Success"

    def weight_version(self):
        return self.label

    def set_weight_version(self, label: str) -> None:
        self.calls.append(("label", label))
        self.label = label

    def release_memory(self, tags):  # SGLang's release_memory_occupation / resume_memory_occupation
        self.calls.append(("release", tags))

    def resume_memory(self, tags):
        self.calls.append(("resume", tuple(tags)))


def _sync(client, store):
    from weightbridge.integrations.sglang.driver import SGLangWeightSync

    return SGLangWeightSync(client, SPEC, host="127.0.0.1", port=store.port, probe="off")


def test_an_update_labels_sglang_with_the_applied_version():
    store = _store()
    client = FakeClient(store)
    sync = _sync(client, store)
    assert client.calls[:3] == [("begin",), ("load", "init", None), ("end",)]
    assert sync.update() is None and sync.version is None  # nothing staged: no session at all
    assert sync.update(3) == 3 and sync.version == 3
    assert client.label == "3" and ("label", "3") not in client.calls  # sent with the update itself


def test_without_replies_the_driver_reads_the_applied_acks():
    store = _store()
    client = FakeClient(store)
    from weightbridge.integrations.sglang.driver import SGLangWeightSync

    sync = SGLangWeightSync(client, SPEC, host="127.0.0.1", port=store.port, probe="off", reply_dir=None)
    _ack(store, 0, 2)
    _ack(store, 1, 2)
    assert sync.staged() is None and sync.update(2) == 2 and client.label == "2"


def test_a_newer_applied_version_relabels_sglang():
    store = _store()
    client = FakeClient(store, applies=5)  # async: a newer version completed meanwhile
    sync = _sync(client, store)
    assert sync.update(4) == 5 and client.label == "5" and client.calls[-1] == ("label", "5")


def test_a_failed_update_raises_the_workers_typed_error_and_keeps_the_old_label():
    store = _store()
    client = FakeClient(store)
    sync = _sync(client, store)
    assert sync.update(1) == 1
    client.error = DeadlineExceeded("rollout 1", "version 2 staged on every rank", 5.0)
    with pytest.raises(DeadlineExceeded, match="version 2 staged") as info:
        sync.update(2)
    assert info.value.rank == "rollout 1"
    assert client.label == "1" and sync.version == 1  # SGLang says what it serves


def test_an_update_sglang_reports_failed_after_writing_still_names_what_is_served():
    from weightbridge.integrations.sglang.driver import EngineCallFailed

    store = _store()
    client = FakeClient(store)
    sync = _sync(client, store)
    client.refuse = "Weights were updated, but the cache was not flushed because requests are still running"
    with pytest.raises(EngineCallFailed, match="cache was not flushed"):
        sync.update(6)
    assert sync.version == 6 and client.label == "6"  # the workers wrote version 6: say so


def test_commands_round_trip_and_reject_foreign_or_invalid_payloads():
    cmd = Command(op="update", seq=3, version=7, timeout_s=1.5, reply_dir="/tmp/x")
    assert decode(encode(cmd)) == cmd
    for bad in ["model.layers.0.mlp.gate_up_proj.weight", PREFIX + "{", PREFIX + '{"op": "rm -rf"}',
                PREFIX + '{"op": "update", "version": -1}', PREFIX + '{"op": "init", "evil": 1}', 42,
                PREFIX + "x" * (5 << 20)]:
        with pytest.raises(CommandError):
            decode(bad)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(max_size=300).map(lambda s: PREFIX + s),
                 st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=5)
                 .map(lambda d: PREFIX + json.dumps({"op": "update", **d}))))
def test_any_payload_name_is_a_command_or_a_command_error(name):
    try:
        assert isinstance(decode(name), Command)
    except CommandError:
        pass


def _sealed_init(spec: str = SPEC, **fields) -> dict:
    """An init command as SGLangWeightSync seals it (the job secret: tests/conftest.py sets one)."""
    from weightbridge.integrations._engine.init_command import Prepared
    from weightbridge.sync.auth import signer_from_env

    fields = {"spec": spec, "host": "127.0.0.1", "port": 1, "probe": "off", **fields}
    return Prepared(None, fields, 5.0, "wb", signer_from_env()).sealed()


def _worker(monkeypatch, tp_rank: int = 0, tp: int = 1):
    from weightbridge.integrations._engine.init_command import InitGate
    from weightbridge.integrations.sglang import worker

    monkeypatch.setattr(worker, "parallel", lambda: {"tp_rank": tp_rank, "tp": tp, "pp": 1, "ep": 1})
    monkeypatch.setattr(worker, "_RECEIVER", None)
    monkeypatch.setattr(worker, "_GATE", InitGate())
    return worker


def test_the_worker_entry_point_never_raises_and_answers_with_the_error(tmp_path, monkeypatch):
    import torch

    worker = _worker(monkeypatch, tp_rank=1, tp=2)
    model = torch.nn.Linear(2, 2)
    worker.load(model, [("not-a-command", torch.empty(0)), (PREFIX + "{", torch.empty(0))])  # logged only
    worker.load(model, [(encode(Command(op="update", seq=9, version=1, reply_dir=str(tmp_path))), torch.empty(0))])
    reply = read_reply(tmp_path, 9, 1)
    assert reply["op"] == "update" and reply["tp_rank"] == 1
    assert reply["error"]["type"] == "builtins:RuntimeError" and "not initialised" in reply["error"]["message"]
    bad_spec = _sealed_init("version: 1\nmodel: {bundled: nope}\n")
    bad_init = Command(op="init", seq=10, reply_dir=str(tmp_path), **bad_spec)
    worker.load(model, [(encode(bad_init), torch.empty(0))])
    assert read_reply(tmp_path, 10, 1)["error"]["type"].endswith(":SpecErrors")


class Running:
    """A receiver already running in the worker (what a refused re-init must leave alone)."""

    me = "rollout 0 (instance 0, SGLang TP rank 0)"

    def __init__(self) -> None:
        self.closed = False
        self.last_error = None

    def close(self) -> None:
        self.closed = True


class Touch:
    """Unpickling this creates ``path`` (what the old wire format's pickled hook could do)."""

    def __init__(self, path) -> None:
        self.path = path

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.path),))


KILL_HOOK = {"name": "suite.kill-after-round", "params": {"host": "127.0.0.1", "port": 1, "prefix": "wb",
                                                          "timeout_s": 1.0, "version": 1, "round": 0}}


def test_a_refused_init_is_answered_typed_and_leaves_the_running_receiver(tmp_path, monkeypatch):
    """Commands arrive through SGLang's admin API: an init that is not sealed with the engine's job
    secret, forged, changed, carries a test hook the engine does not enable, or is a replay, runs
    nothing, is answered with InitRefused, and the running receiver stays."""
    import base64

    import torch

    from weightbridge.integrations._engine.hooks import TEST_HOOKS_ENV

    worker = _worker(monkeypatch, tp_rank=0, tp=2)
    running = Running()
    monkeypatch.setattr(worker, "_RECEIVER", running)
    marker = tmp_path / "pwned"
    genuine = _sealed_init()
    cases = {
        "unsealed": ({**genuine, "seal": None}, "0", "not sealed with the job secret"),
        "forged": ({**genuine, "seal": "00" * 16}, "0", "does not verify"),
        "changed": ({"payload": genuine["payload"].replace('"port":1', '"port":2'), "seal": genuine["seal"]}, "0",
                    "does not verify"),
        "hook, hooks off": (_sealed_init(test_hook=KILL_HOOK), "0", "does not enable test hooks"),
        "unknown hook": (_sealed_init(test_hook={"name": "os:system", "params": {"command": f"touch {marker}"}}), "1",
                         "unknown test hook"),
    }
    for seq, (case, (fields, hooks_on, why)) in enumerate(cases.items(), 1):
        monkeypatch.setenv(TEST_HOOKS_ENV, hooks_on)
        worker.load(torch.nn.Linear(2, 2), [(encode(Command(op="init", seq=seq, reply_dir=str(tmp_path), **fields)),
                                             torch.empty(0))])
        err = read_reply(tmp_path, seq, 0)["error"]
        assert err["type"] == "weightbridge.errors:InitRefused" and why in err["message"], (case, err)
        assert err["attrs"]["rank"] == running.me  # named as the rank it runs
        assert worker._RECEIVER is running and not running.closed, case
    # the old wire format (a pickled on_round) is no command, even where test hooks are on: nothing
    # is unpickled, nothing answers, nothing changes
    old = PREFIX + json.dumps({"op": "init", "seq": 99, "reply_dir": str(tmp_path), "spec": SPEC, "host": "x",
                               "port": 1, "on_round": base64.b64encode(pickle.dumps(Touch(marker))).decode()})
    worker.load(torch.nn.Linear(2, 2), [(old, torch.empty(0))])
    assert read_reply(tmp_path, 99, 0) is None and not marker.exists()
    assert worker._RECEIVER is running and not running.closed
    # a genuine init that does not fit this engine (EngineMismatch: a Linear is no Qwen2) changes
    # nothing either; the same command again is a replay
    with_hook = _sealed_init(test_hook=KILL_HOOK)
    for seq, why in ((50, "EngineMismatch"), (51, "InitRefused")):
        worker.load(torch.nn.Linear(2, 2), [(encode(Command(op="init", seq=seq, reply_dir=str(tmp_path), **with_hook)),
                                             torch.empty(0))])
        err = read_reply(tmp_path, seq, 0)["error"]
        assert err["type"] == f"weightbridge.errors:{why}", err
        assert worker._RECEIVER is running and not running.closed
    assert "replay" in err["message"]


def test_sleep_releases_the_bridge_and_sglang_then_an_update_resumes_weights_first_and_the_rest_after():
    """SGLang on CPU cannot release memory (torch_memory_saver is CUDA-only): the driver's order, against
    SGLang's documented API (release_memory_occupation / resume_memory_occupation(tags))."""
    store = _store()
    client = FakeClient(store)
    sync = _sync(client, store)
    client.calls.clear()
    sync.sleep()
    assert client.calls == [("begin",), ("load", "release", None), ("end",), ("release", None)]
    client.calls.clear()
    assert sync.update(3) == 3
    assert client.calls[0] == ("resume", ("weights",))
    assert client.calls[1:4] == [("begin",), ("load", "update", "3"), ("end",)]
    assert client.calls[4] == ("resume", ("kv_cache", "cuda_graph")) and not sync.sleeping
    client.calls.clear()
    assert sync.update(4) == 4 and not [c for c in client.calls if c[0] == "resume"]


def test_a_failed_update_of_a_released_engine_keeps_its_kv_cache_released():
    store = _store()
    client = FakeClient(store, error=DeadlineExceeded("rollout 0", "version 3 staged", 5.0))
    sync = _sync(client, store)
    sync.sleep()
    with pytest.raises(DeadlineExceeded):
        sync.update(3)
    assert sync.sleeping == {"kv_cache", "cuda_graph"}
def test_auto_reply_directories_and_reply_files_are_removed(tmp_path, monkeypatch):
    """Issue 33: ``reply_dir="auto"`` left a ``wb-sglang-*`` directory in /tmp per driver and a reply
    file per command and TP rank; now each reply is removed once read, and the directory by close(),
    a failed init, or when the driver is dropped unclosed."""
    import gc
    import tempfile

    from weightbridge.integrations.sglang.driver import EngineCallFailed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mkdtemp's parent: this test's own directory
    store = _store()
    sync = _sync(FakeClient(store), store)
    [reply_dir] = tmp_path.iterdir()
    for v in (1, 2, 3):
        assert sync.update(v) == v
    assert list(reply_dir.iterdir()) == []  # every reply read once, then removed
    sync.close()
    assert list(tmp_path.iterdir()) == []
    _sync(FakeClient(store), store)  # never closed, dropped
    gc.collect()
    assert list(tmp_path.iterdir()) == []
    refusing = FakeClient(store)
    refusing.refuse = "no"
    with pytest.raises(EngineCallFailed, match="init"):
        _sync(refusing, store)
    assert list(tmp_path.iterdir()) == []
