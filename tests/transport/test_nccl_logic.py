"""The executor's NCCL branch (coalesced batches, host-side polling deadline) against an in-process fake.

No GPU here: the loopback stand-in (:mod:`weightbridge.testing._internal.loopback`: the ``ProcessGroupNCCL``
surface the executor uses, ``_start_coalescing`` / ``send`` / ``recv`` / ``_end_coalescing`` returning
one work whose ``is_completed()`` is polled) connects executors running in threads of this process,
on CPU tensors. It checks the batching logic, the device checksums and the deadline handling of that
branch; the real NCCL calls are exercised by ``bench/gpu_readiness.py`` and ``bench/gpu_check.py`` on
a GPU machine.
"""

from __future__ import annotations

import time

import pytest
import torch

from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.testing._internal.loopback import LoopbackHub as _Hub
from weightbridge.testing._internal.loopback import LoopbackNccl as _FakeNccl
from weightbridge.testing._internal.loopback import LoopbackWorld
from weightbridge.transport import BridgeGroup, Executor, PeerTimeout
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize

SPEC = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}}
"""


@pytest.mark.parametrize(("chunk_bytes", "direct_bytes"), [(1000, 1 << 20), (64 << 20, 1 << 20), (1000, 64), (64 << 20, 64)])
def test_nccl_branch_moves_bytes_bitwise(chunk_bytes: int, direct_bytes: int) -> None:
    """Also with large items as messages of their own (``direct_bytes`` 64: zero-copy where contiguous)."""
    r, problems = check_text(SPEC)
    assert not problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=16 << 10, receiver_dedup="on")
    S, R = r.trainer.world_size, r.rollout.world_size
    canon = canonical_tensors(r.canonical, seed=5)
    world = LoopbackWorld(plan, chunk_bytes=chunk_bytes, checksums=True, direct_bytes=direct_bytes)
    hub = world.hub
    dsts = [empty_like_layout(r.rollout.ranks[q], fill=3.0) for q in range(R)]
    world.run([materialize(r.trainer.ranks[t], canon) for t in range(S)], dsts, wall_s=30)
    for q in range(R):
        assert diff_tensors(dsts[q], materialize(r.rollout.ranks[q], canon, fill=3.0)) == []
    assert hub.max_batch >= 2  # several peers/directions per coalesced batch
    assert hub.pending() == 0
    if chunk_bytes == 1000:  # several waves per round: all issued before the round waits (was one at a time)
        assert hub.max_in_flight >= 2, hub.max_in_flight


def test_nccl_branch_deadline_names_the_peer() -> None:
    r, _ = check_text(SPEC)
    plan = build_plan(r.trainer, r.rollout, round_bytes=1 << 20)
    S, R = r.trainer.world_size, r.rollout.world_size
    g = BridgeGroup(_FakeNccl(_Hub(), S), S, S + R, "nccl", S, 0.3, torch.device("cpu"))
    ex = Executor(plan, g, side="rollout", rank=0, device="cpu")
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout) as info:
        ex.run(empty_like_layout(r.rollout.ranks[0]))  # no trainer ever sends
    assert time.monotonic() - t0 < 3
    assert info.value.rank == S and info.value.peer in range(S) and info.value.round == 0


def test_nccl_branch_with_delta_updates() -> None:
    """``sync.delta`` on NCCL: wave 0 carries every header, the rest is issued at once after it."""
    r, _ = check_text(SPEC)
    plan = build_plan(r.trainer, r.rollout, round_bytes=16 << 10)
    S, R = r.trainer.world_size, r.rollout.world_size
    world = LoopbackWorld(plan, chunk_bytes=1000, checksums=True, delta="on")
    dsts = [empty_like_layout(r.rollout.ranks[q]) for q in range(R)]
    for version in (1, 2):
        canon = canonical_tensors(r.canonical, seed=5)
        if version == 2:
            name = next(iter(canon))
            canon[name].view(-1)[:3] += 1  # three elements change: deltas
        stats = world.run([materialize(r.trainer.ranks[t], canon) for t in range(S)], dsts, version=version, wall_s=30)
        for q in range(R):
            assert diff_tensors(dsts[q], materialize(r.rollout.ranks[q], canon)) == []
    assert sum(st.delta_buckets for st in stats[:S]) > 0 and world.hub.pending() == 0
