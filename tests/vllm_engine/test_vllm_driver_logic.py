"""The vLLM driver and conformance unit's own logic, with a fake ``LLM`` (runs without vLLM)."""

from __future__ import annotations

import pytest

from weightbridge.sync.messages import Ack, Keys, encode
from weightbridge.transport.store import open_store

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync: {mode: sync, timeout_s: 5}
"""


class FakeLLM:
    """What VLLMWeightSync touches of ``vllm.LLM``; ``update_weights`` raises ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        cfg = type("Cfg", (), {"backend": "weightbridge"})()
        self.llm_engine = type("Engine", (), {"vllm_config": type("V", (), {"weight_transfer_config": cfg})()})()
        self.error = error
        self.calls: list[tuple] = []

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


def _ack(store, rank: int, version: int) -> None:
    """An ack as a rollout rank writes it: sealed with the job secret (tests/conftest.py sets one)."""
    from weightbridge.sync.auth import signer_from_env

    key = Keys("wb").ack("applied", rank)
    store.set(key, signer_from_env().seal(key, encode(Ack(rank=rank, version=version, seq=version, epoch=1,
                                                                stage="applied"))))
    store.check([key])  # a set is not answered: this round trip on the same connection waits until it was served


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


def test_the_conformance_unit_raises_nothing_to_apply_before_any_version():
    from weightbridge.errors import NothingToApply
    from weightbridge.integrations.vllm.conformance import VLLMRolloutUnit

    unit = VLLMRolloutUnit.__new__(VLLMRolloutUnit)  # no engine: only apply()'s own logic runs
    unit.label, unit._ready = "rollout instance 0 (ranks [0, 1])", None
    unit.sync = type("Sync", (), {"version": None})()
    unit.poll = lambda: False
    with pytest.raises(NothingToApply, match="rollout instance 0"):
        unit.apply()
