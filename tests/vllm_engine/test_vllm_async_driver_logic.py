"""``AsyncVLLMWeightSync``'s own sequence with a fake ``AsyncLLM`` (the real engine:
test_vllm_async.py): every update inside pause/resume, labelled with the applied version, and a
failed update finished and resumed before its error is raised."""

from __future__ import annotations

import asyncio

import pytest

from weightbridge.testing._internal.optional import require
from weightbridge.transport.store import open_store

require("vllm", extra="vllm-cpu", reason="the AsyncLLM driver builds vLLM's request objects")

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync: {mode: async, timeout_s: 5}
"""


class FakeAsyncLLM:
    def __init__(self, error: BaseException | None = None) -> None:
        self.vllm_config = type("V", (), {"weight_transfer_config": type("C", (), {"backend": "weightbridge"})()})()
        self.error, self.calls = error, []
        self.sleeping: set[str] = set()  # as vLLM's executor: sleep() puts both tags to sleep, wake_up wakes some

    async def is_sleeping(self):
        return bool(self.sleeping)

    async def sleep(self, level=1):
        self.calls.append(("sleep", level))
        self.sleeping = {"weights", "kv_cache"}

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        self.sleeping -= set(tags or self.sleeping)

    async def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method))

    async def init_weight_transfer_engine(self, request):
        from weightbridge.integrations._engine.init_command import InitGate

        info = request.init_info  # a sealed init command, as the workers check it
        self.calls.append(("init", InitGate().open(info["payload"], info["seal"], "worker").instance))

    async def update_weight_version(self, label):
        self.calls.append(("label", label))

    async def pause_generation(self, *, mode, clear_cache):
        self.calls.append(("pause", mode, clear_cache))

    async def resume_generation(self):
        self.calls.append(("resume",))

    async def start_weight_update(self):
        self.calls.append(("start",))

    async def update_weights(self, request):
        self.calls.append(("update", request.update_info["version"]))
        if self.error is not None:
            raise self.error

    async def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish", weight_version))


def _ack(store, rank, version, stage="applied"):
    from weightbridge.sync.auth import signer_from_env
    from weightbridge.sync.messages import Ack, Keys, encode

    key = Keys("wb").ack(stage, rank)
    store.set(key, signer_from_env().seal(key, encode(Ack(rank=rank, version=version, seq=version, epoch=1,
                                                                stage=stage))))
    store.check([key])  # set sends no reply: return once the store has it, as Board.ack does


def test_updates_run_inside_pause_and_resume_labelled_with_the_applied_version():
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync

    async def main():
        store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
        engine = FakeAsyncLLM()
        sync = await AsyncVLLMWeightSync.create(engine, SPEC, host="127.0.0.1", port=store.port, probe="off",
                                                initial_version=0)
        assert engine.calls == [("init", 0), ("label", "0")]
        engine.calls.clear()
        assert await sync.update(pause="wait") is None and engine.calls == []  # nothing staged: no pause
        for r in (0, 1):
            _ack(store, r, 3, "staged")
            _ack(store, r, 3)
        assert await sync.update(pause="abort", clear_cache=False) == 3
        assert engine.calls == [("pause", "abort", False), ("start",), ("update", None), ("finish", "3"), ("resume",)]
        with pytest.raises(ValueError, match="pause"):
            await sync.update(4, pause="drain")

    asyncio.run(main())


def test_a_failed_update_is_finished_and_resumed_then_raised():
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync

    async def main():
        store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
        engine = FakeAsyncLLM(RuntimeError("Worker failed with error 'DeadlineExceeded'"))
        sync = await AsyncVLLMWeightSync.create(engine, SPEC, host="127.0.0.1", port=store.port, probe="off")
        engine.calls.clear()
        with pytest.raises(RuntimeError, match="DeadlineExceeded"):
            await sync.update(2)
        assert engine.calls == [("pause", "keep", True), ("start",), ("update", 2), ("finish", None), ("resume",)]
        assert sync.version is None

    asyncio.run(main())


def test_the_engine_must_have_the_backend():
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync

    engine = FakeAsyncLLM()
    engine.vllm_config.weight_transfer_config.backend = "nccl"
    with pytest.raises(ValueError, match="backend is 'nccl'"):
        asyncio.run(AsyncVLLMWeightSync.create(engine, SPEC, host="127.0.0.1", port=1))


def test_a_sleeping_engine_wakes_its_weights_before_and_its_kv_cache_after_the_update():
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync

    async def main():
        store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
        engine = FakeAsyncLLM()
        sync = await AsyncVLLMWeightSync.create(engine, SPEC, host="127.0.0.1", port=store.port, probe="off")
        engine.calls.clear()
        await sync.sleep(2)
        assert engine.calls == [("rpc", "weightbridge_release"), ("sleep", 2)]
        engine.calls.clear()
        for r in (0, 1):
            _ack(store, r, 3)
        assert await sync.update(3, pause="wait") == 3
        assert engine.calls == [("wake_up", ("weights",)), ("pause", "wait", True), ("start",), ("update", 3),
                                ("finish", "3"), ("wake_up", ("kv_cache",)), ("resume",)]
        assert not engine.sleeping

    asyncio.run(main())
