"""Checkpoint-dtype semantics over real Gloo processes: a rollout holding a tensor wider than the
checkpoint's (an fp32 engine on a bf16 checkpoint, as vLLM keeps Qwen3-Next's ``A_log``) receives
the checkpoint-rounded values, bitwise what an engine loading the checkpoint holds, from an fp32
trainer that rounds nothing itself; with receiver de-replication (rollout ranks forward) and delta
updates (applied in the wire dtype onto the wider destination)."""

from __future__ import annotations

import pytest

from weightbridge.plan import validate_plan

from test_delta_mp import check_bitwise, run  # noqa: I001 - sibling module (tests/transport)
from transport_workers import resolve

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

BF16_CHECKPOINT_FP32_ROLLOUT = """
version: 1
model: {bundled: tiny-qwen2, dtype: bfloat16}
trainer: {preset: fsdp2, mesh: {dp: 2}, dtype: float32}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}, dtype: float32}
"""


def test_fp32_rollout_of_a_bf16_checkpoint_gets_bf16_rounded_values_with_deltas_and_forwards() -> None:
    r = resolve(BF16_CHECKPOINT_FP32_ROLLOUT)
    assert {d for _, d in r.rollout.casts} == {"bfloat16"} and len(r.rollout.casts) == len(r.canonical.tensors)
    plan, outs = run(BF16_CHECKPOINT_FP32_ROLLOUT, round_bytes=64 << 10, receiver_dedup="on", versions=6,
                     lr=1e-4, delta="on")
    assert {it.dtype for it in plan.items()} == {"bfloat16"}  # half an fp32 rollout's bytes on the wire
    assert plan.exchange_bytes > 0
    assert validate_plan(plan, r.trainer, r.rollout, canonical=r.canonical) == []
    check_bitwise(outs, 6)  # == materialize(checkpoint-rounded canonical), every version, every rank
    deltas = sum(o["versions"][-1]["delta_buckets"] for o in outs)
    assert deltas > 0  # later versions went as deltas onto the fp32 destinations
