"""The vLLM driver and conformance unit's own logic, with a fake ``LLM`` (runs without vLLM)."""

from __future__ import annotations

import pytest

from weightbridge.sync.messages import Announce, Keys
from weightbridge.transport.store import open_store

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync: {mode: sync, timeout_s: 5}
"""


class FakeLLM:
    """What VLLMWeightSync touches of ``vllm.LLM``; ``update_weights`` raises ``error``. Sleep as vLLM's
    executor documents it: ``sleep(level)`` puts the tags weights and kv_cache to sleep, ``wake_up(tags)``
    wakes those (all with None), the engine is sleeping while any tag is (``LLMEngine.is_sleeping``)."""

    def __init__(self, error: BaseException | None = None) -> None:
        cfg = type("Cfg", (), {"backend": "weightbridge"})()
        self.sleeping: set[str] = set()
        self.llm_engine = type("Engine", (), {"vllm_config": type("V", (), {"weight_transfer_config": cfg})(),
                                              "is_sleeping": lambda _: bool(self.sleeping)})()
        self.error = error
        self.calls: list[tuple] = []

    def sleep(self, level=1):
        self.calls.append(("sleep", level))
        self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        self.sleeping -= set(tags or self.sleeping)
        return not self.sleeping

    def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method))
        return [None, None]

    def init_weight_transfer_engine(self, request):
        self.calls.append(("init",))

    def start_weight_update(self):
        self.calls.append(("start",))

    def update_weights(self, request):
        self.calls.append(("update", request["update_info"]["version"]))
        if self.error is not None:
            raise self.error

    def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish", weight_version))


def _board(store, rank: int):
    """What a rollout rank writes its acks with (sealed with the job secret, which tests/conftest.py sets)."""
    from weightbridge.sync.board import Board
    from weightbridge.sync.control import ControlPlane
    from weightbridge.sync.roster import ROLLOUT, RankId

    return Board(ControlPlane(store, me=RankId(ROLLOUT, rank), keys=Keys("wb"), timeout_s=10))


def _ack(store, rank: int, version: int) -> None:
    """An ack as a rollout rank writes it (:meth:`Board.ack`)."""
    _board(store, rank).ack("applied", Announce(seq=version, version=version, epoch=1))


def test_a_failed_update_raises_its_own_error_even_when_reading_the_result_fails_too():
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    llm = FakeLLM(ValueError("boom: the workers' update failed"))
    sync = VLLMWeightSync(llm, SPEC, host="127.0.0.1", port=store.port, probe="off")
    _ack(store, 0, 3)
    _ack(store, 1, 2)  # the workers disagree (the failed update left them so): reading back fails as well
    with pytest.raises(ValueError, match="boom"):
        sync.update(3)
    assert llm.calls[-1][0] == "finish"  # vLLM's protocol is still closed


def test_the_driver_reads_the_applied_version_of_the_instance():
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    llm = FakeLLM()
    sync = VLLMWeightSync(llm, SPEC, host="127.0.0.1", port=store.port, probe="off")
    assert sync.staged() is None and sync.update() is None and sync.version is None
    _ack(store, 0, 4)
    _ack(store, 1, 4)
    applied = sync.update(4)
    seen = {r: sync.view.board.ack_of("applied", r) for r in sync.view.ranks}  # what the driver reads, if not 4
    assert applied == 4 and sync.version == 4, (seen, sync.view.ranks, llm.calls)
    assert llm.calls[-1] == ("finish", "4")


def test_an_ack_is_there_for_every_reader_the_moment_the_rank_wrote_it():
    """The race behind a flaky driver test: TCPStore's ``set`` sends no reply, so a read on another
    connection (the driver's view, right after the workers' apply returned) could be answered before
    the server handled the set, and see the previous ack or none (the driver then returned None with
    both acks on the store a moment later). ``Board.ack`` returns only once the store has it."""
    from weightbridge.bridge import InstanceView, load_spec

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    writer = _board(open_store("127.0.0.1", store.port, is_master=False, timeout_s=10), 0)  # the rank's connection
    view = InstanceView.connect(load_spec(SPEC.replace("tp: 2", "tp: 1")), 0, host="127.0.0.1", port=store.port)
    seen = []
    for version in range(1, 1001):  # without the wait, ~7% of these reads missed on a 2-core machine
        writer.ack("applied", Announce(seq=version, version=version, epoch=1))
        seen.append(view.applied())
    assert seen == list(range(1, 1001)), [(v, s) for v, s in enumerate(seen, 1) if s != v][:5]


def test_the_conformance_unit_raises_nothing_to_apply_before_any_version():
    from weightbridge.errors import NothingToApply
    from weightbridge.integrations.vllm.conformance import VLLMRolloutUnit

    unit = VLLMRolloutUnit.__new__(VLLMRolloutUnit)  # no engine: only apply()'s own logic runs
    unit.label, unit._ready = "rollout instance 0 (ranks [0, 1])", None
    unit.sync = type("Sync", (), {"version": None})()
    unit.poll = lambda: False
    with pytest.raises(NothingToApply, match="rollout instance 0"):
        unit.apply()


def test_an_engine_put_to_sleep_releases_the_bridge_then_wakes_weights_update_kv_cache():
    """``sleep`` frees what every worker's bridge keeps, then sleeps; ``update`` wakes the weights,
    runs vLLM's protocol, and wakes the KV cache only after it (vLLM's RL order: no KV cache memory
    against the update). The real engine's path: tests/vllm_engine/test_vllm_integration.py."""
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    llm = FakeLLM()
    sync = VLLMWeightSync(llm, SPEC, host="127.0.0.1", port=store.port, probe="off")
    sync.sleep(level=1)
    assert llm.calls[1:] == [("rpc", "weightbridge_release"), ("sleep", 1)]
    _ack(store, 0, 5)
    _ack(store, 1, 5)
    del llm.calls[:]
    assert sync.update(5) == 5
    assert llm.calls == [("wake_up", ("weights",)), ("start",), ("update", 5), ("finish", "5"),
                         ("wake_up", ("kv_cache",))]
    assert not llm.sleeping
    del llm.calls[:]
    assert sync.update(5) == 5 and ("wake_up", ("weights",)) not in llm.calls  # awake: no wake-up


def test_a_failed_update_of_a_sleeping_engine_leaves_its_kv_cache_asleep():
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    llm = FakeLLM(ValueError("boom"))
    sync = VLLMWeightSync(llm, SPEC, host="127.0.0.1", port=store.port, probe="off")
    sync.sleep()
    with pytest.raises(ValueError, match="boom"):
        sync.update(3)
    assert llm.sleeping == {"kv_cache"} and llm.calls[-1][0] == "finish"
