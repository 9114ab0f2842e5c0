"""Checkpoint-dtype semantics in the pure core: which canonical tensors pass through the checkpoint's
dtype (``layout.ir.checkpoint_cast``, ``SideLayout.casts``), the plan moving them in it, and
``validate_plan`` refusing a plan that does not."""

from __future__ import annotations

import dataclasses

import pytest

from weightbridge.layout.ir import checkpoint_cast
from weightbridge.plan import build_plan, validate_plan
from weightbridge.spec.resolve import load_spec

SPEC = """version: 1
model:
  tensors:
    - {name: w, shape: [8, 4], dtype: float32}
    - {name: a_log, shape: [4], dtype: bfloat16}
    - {name: h, shape: [4], dtype: float16}
trainer: {preset: none, axes: [dp], mesh: {dp: 2}, rules: [{local: "{*}", canonical: "{*}"}], dtype: float32}
rollout: {preset: none, axes: [tp], mesh: {tp: 2}, rules: [{local: "{*}", canonical: "{*}", shard: [{dim: 0, axis: tp}]}], dtype: ROLLOUT}
"""


@pytest.mark.parametrize(("local", "checkpoint", "via"), [
    ("float32", "bfloat16", "bfloat16"), ("float32", "float16", "float16"), ("float64", "float32", "float32"),
    ("bfloat16", "bfloat16", None), ("bfloat16", "float32", None), ("bfloat16", "float16", None),
    ("float32", "float8_e4m3fn", None), ("int64", "int32", None), ("float32", "int8", None),
])
def test_checkpoint_cast_only_through_a_narrower_float(local: str, checkpoint: str, via: str | None) -> None:
    assert checkpoint_cast(local, checkpoint) == via


def test_plan_moves_narrow_checkpoint_tensors_in_their_dtype_and_validation_requires_it() -> None:
    r = load_spec(SPEC.replace("ROLLOUT", "float32"))
    assert r.rollout.casts == (("a_log", "bfloat16"), ("h", "float16"))
    plan = build_plan(r.trainer, r.rollout, round_bytes=1 << 20)
    assert {it.canonical: it.dtype for it in plan.items()} == {"w": "float32", "a_log": "bfloat16", "h": "float16"}
    assert validate_plan(plan, r.trainer, r.rollout, canonical=r.canonical) == []
    # A plan that ignores the casts (fp32 on the wire) delivers unrounded values: refused.
    blind = build_plan(r.trainer, dataclasses.replace(r.rollout, casts=()), round_bytes=1 << 20)
    problems = validate_plan(blind, r.trainer, r.rollout, canonical=r.canonical)
    assert {p.kind for p in problems} == {"dtype"}
    assert any("wire dtype float32 is not the checkpoint's (receiver: float32) bfloat16" in p.message for p in problems)
    assert validate_plan(blind, r.trainer, r.rollout)  # without `canonical`: from the layout's casts


def test_a_bf16_rollout_has_no_casts() -> None:
    r = load_spec(SPEC.replace("ROLLOUT", "bfloat16"))
    assert r.rollout.casts == ()
    plan = build_plan(r.trainer, r.rollout, round_bytes=1 << 20)
    assert {it.dtype for it in plan.items()} == {"bfloat16"}
