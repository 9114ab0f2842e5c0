"""``delta`` over real Gloo processes: many versions, every one bitwise on every rollout rank, deltas
actually sent (fewer bytes on the wire), exchange rounds and multi-chunk messages included; a receiver
whose destination was written by someone else refuses the next delta."""

from __future__ import annotations

import pytest

from weightbridge.plan import validate_plan
from weightbridge.localrun import launch
from weightbridge.transport import open_store

from transport_delta_workers import delta_transfer  # noqa: I001 - sibling module (tests/transport)
from transport_workers import make_plan, resolve

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

FP32_TO_BF16_DEDUP = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}, dtype: float32}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}, dtype: bfloat16}
"""

MOE_EP = """
version: 1
model: {bundled: tiny-qwen3-moe}
trainer: {preset: megatron, mesh: {dp: 2, ep: 2, etp: 1}}
rollout: {preset: vllm, mesh: {tp: 2, ep: 2}}
"""


def run(yaml_text: str, *, round_bytes: int, receiver_dedup: str = "off", wall_s: float = 120, **cfg):
    r = resolve(yaml_text)
    plan_kwargs = {"round_bytes": round_bytes, "receiver_dedup": receiver_dedup}
    plan = make_plan(r, plan_kwargs)
    assert validate_plan(plan, r.trainer, r.rollout) == []
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)
    base = {"yaml": yaml_text, "plan": plan_kwargs, "port": store.port, **cfg}
    jobs = [({**base, "side": "trainer", "rank": t},) for t in range(r.trainer.world_size)]
    jobs += [({**base, "side": "rollout", "rank": q},) for q in range(r.rollout.world_size)]
    outs = [res.unwrap() for res in launch(delta_transfer, jobs, timeout_s=wall_s)]
    del store
    return plan, outs


def check_bitwise(outs, versions: int) -> None:
    for o in outs:
        assert "error" not in o, o.get("error")
        assert len(o["versions"]) == versions, (o["side"], o["rank"])
        if o["side"] == "rollout":
            for rec in o["versions"]:
                assert rec["diff"] == [], (o["rank"], rec["version"], rec["diff"])


def test_22_versions_fp32_master_to_bf16_with_exchange_rounds_and_small_chunks() -> None:
    plan, outs = run(FP32_TO_BF16_DEDUP, round_bytes=64 << 10, receiver_dedup="on", versions=22, lr=2e-5,
                     chunk_bytes=8 << 10, overlap="thread", delta="on")
    assert plan.exchange_bytes > 0 and plan.num_rounds > 2
    check_bitwise(outs, 22)
    senders = [o for o in outs if o["side"] == "trainer"] + [o for o in outs if o["side"] == "rollout"]
    first = sum(o["versions"][0]["wire_bytes_sent"] for o in senders)
    for v in range(1, 22):
        recs = [o["versions"][v] for o in senders]
        assert sum(x["full_buckets"] for x in recs) == 0, v  # small steps: every bucket is a delta
        changed = sum(x["changed_elements"] for x in recs) / sum(x["compared_elements"] for x in recs)
        wire = sum(x["wire_bytes_sent"] for x in recs)
        assert 0 < changed < 0.5 and wire < 0.6 * first, (v, changed, wire, first)
    # exchange senders (rollout ranks forwarding to the other instance) send deltas too
    assert sum(o["versions"][5]["delta_buckets"] for o in outs if o["side"] == "rollout") > 0
    for o in outs:  # the sender's copy: exactly what it sends per push; receivers keep none
        sent = o["versions"][-1]["bytes_sent"]
        assert o["versions"][-1]["delta_cache_bytes"] == sent
        assert o["versions"][-1]["peak_buffer_bytes"] <= 2 * plan.round_bytes + 80 * len(list(plan.buckets()))


def test_auto_backs_off_on_dense_changes_and_returns_to_deltas() -> None:
    lrs = [0.0] + [1e-5] * 3 + [1e-2] * 4 + [1e-5] * 14
    plan, outs = run(FP32_TO_BF16_DEDUP, round_bytes=256 << 10, versions=len(lrs), lr=lrs, delta="auto")
    check_bitwise(outs, len(lrs))
    trainers = [o for o in outs if o["side"] == "trainer"]

    def kinds(v: int) -> tuple[int, int]:
        return (sum(o["versions"][v - 1]["delta_buckets"] for o in trainers),
                sum(o["versions"][v - 1]["full_buckets"] for o in trainers))

    assert kinds(1)[0] == 0 and kinds(3)[1] == 0  # first push full, small steps as deltas
    assert all(kinds(v)[0] == 0 for v in (7, 8))  # big steps: full, without comparing
    assert any(kinds(v)[1] == 0 for v in range(12, len(lrs) + 1))  # back to deltas afterwards
    assert trainers[0]["versions"][7]["compared_elements"] == 0


def test_moe_experts_and_transposed_layouts() -> None:
    _, outs = run(MOE_EP, round_bytes=32 << 10, versions=6, lr=1e-4, delta="on", overlap="off")
    check_bitwise(outs, 6)
    assert sum(o["versions"][-1]["delta_buckets"] for o in outs if o["side"] == "trainer") > 0


def test_a_destination_written_by_someone_else_refuses_the_next_delta() -> None:
    _, outs = run(FP32_TO_BF16_DEDUP, round_bytes=1 << 20, versions=4, lr=1e-5, delta="on", touch=3, timeout_s=8)
    touched = [o for o in outs if o["side"] == "rollout" and "error" in o]
    assert touched, outs
    for o in touched:
        kind, msg, _ = o["error"]
        assert kind == "DeltaBaseMismatch" and "holds no known version" in msg, msg
        assert [x["version"] for x in o["versions"]] == [1, 2]
        assert all(x["diff"] == [] for x in o["versions"])
