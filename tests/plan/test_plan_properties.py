"""Hypothesis properties of build_plan over random layout pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_helpers import layout_pairs, local_for, shard_box

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import RankLayout, SideLayout, dtype_bytes
from weightbridge.plan import build_plan, validate_plan
from weightbridge.plan.geometry import num_rows, row_axis

SETTINGS = settings(
    max_examples=int(os.environ.get("WB_HYPO", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(layout_pairs())
def test_exact_cover_and_min_wire_bytes_without_receiver_dedup(pair):
    trainer, rollout, cap = pair
    plan = build_plan(trainer, rollout, round_bytes=cap, receiver_dedup="off")
    assert validate_plan(plan, trainer, rollout) == []
    assert plan.wire_bytes == plan.update_bytes == plan.min_wire_bytes


@SETTINGS
@given(layout_pairs())
def test_exact_cover_with_receiver_dedup(pair):
    trainer, rollout, cap = pair
    plan = build_plan(trainer, rollout, round_bytes=cap, receiver_dedup="on")
    assert validate_plan(plan, trainer, rollout) == []
    assert plan.wire_bytes == plan.min_wire_bytes


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
    r=st.integers(2, 6),
    receivers=st.integers(1, 4),
    rdim=st.integers(0, 2),
)
def test_identical_replicas_each_send_within_one_row_of_one_rth(shape, r, receivers, rdim):
    tr = SideLayout("trainer", tuple(
        RankLayout("trainer", j, (local_for("W", tuple((0, s) for s in shape), "bfloat16", 0),)) for j in range(r)))
    dim = rdim if rdim < len(shape) else None
    ro = SideLayout("rollout", tuple(
        RankLayout("rollout", i, (local_for("W", shard_box(shape, dim, receivers, i), "bfloat16", 0),), local_rank=i)
        for i in range(receivers) if box_numel(shard_box(shape, dim, receivers, i))))
    plan = build_plan(tr, ro, round_bytes=1 << 20, receiver_dedup="off")
    assert validate_plan(plan, tr, ro) == []
    sent = plan.sender_bytes()
    total = plan.wire_bytes
    es = dtype_bytes("bfloat16")
    # an element-row: the elements of one index along the row axis of a receiver's box
    row = max(box_numel(lay.tensors[0].pieces[0].canonical_box) // num_rows(lay.tensors[0].pieces[0].canonical_box)
              for lay in ro.ranks) * es
    for j in range(r):
        assert abs(sent.get(j, 0) - total / r) <= row, (sent, total, row)
    assert row_axis(((0, 1), (0, 5))) == 1


_HASH_SCRIPT = r"""
import json, sys
sys.path.insert(0, {tests!r})
from weightbridge.testing._internal.synthetic_layouts import moe_layouts
from weightbridge.plan import build_plan
tr, ro = moe_layouts(num_layers=4, num_dense=1, num_experts=8, hidden=32, inter=16, dense_inter=48, vocab=100,
                     pp=2, ep=2, instances=3, rollout_tp=2, share_instances={share})
out = {{d: build_plan(tr, ro, round_bytes=1 << 22, receiver_dedup=d).plan_hash for d in ("off", "on")}}
print(json.dumps(out))
"""


def _hashes_in_subprocess(seed: str, share: bool) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    code = _HASH_SCRIPT.format(tests=str(Path(__file__).parent), share=share)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_plan_hash_identical_across_processes_runs_and_object_sharing():
    from weightbridge.testing._internal.synthetic_layouts import moe_layouts

    tr, ro = moe_layouts(num_layers=4, num_dense=1, num_experts=8, hidden=32, inter=16, dense_inter=48, vocab=100,
                         pp=2, ep=2, instances=3, rollout_tp=2)
    here = {d: build_plan(tr, ro, round_bytes=1 << 22, receiver_dedup=d).plan_hash for d in ("off", "on")}
    assert here["off"] != here["on"]
    assert _hashes_in_subprocess("1", True) == here
    assert _hashes_in_subprocess("12345", False) == here


@SETTINGS
@given(layout_pairs(), st.sampled_from(["off", "on"]))
def test_a_streaming_receiver_holds_each_tensor_from_its_first_to_its_last_use_in_the_plan(pair, dedup):
    """plan.streaming: every local tensor a rollout rank's plan writes is handed over exactly once, after
    every round and local copy that writes it and every exchange send that reads it; local copies run
    once their source holds all it receives; the peak is at most the rank's shard and at least its
    largest tensor."""
    from weightbridge.plan.streaming import plan_stream_peaks, rank_rounds, stream_schedule

    trainer, rollout, cap = pair
    plan = build_plan(trainer, rollout, round_bytes=cap, receiver_dedup=dedup)
    sizes = [{t.name: t.nbytes for t in r.tensors} for r in rollout.ranks]
    peaks = plan_stream_peaks(plan, sizes)
    for r, layout in enumerate(rollout.ranks):
        mine = rank_rounds(plan, r)
        copies = [c for c in plan.local_copies if c.rank == r]
        sched = stream_schedule(mine, copies)
        done = {n: pos for pos, names in sched.done.items() for n in names}
        assert sorted(done) == sorted(set(done)) == sorted(sched.first)
        for pos, (_, sends, recvs) in enumerate(mine):
            for b in recvs:
                for it in b.items:
                    assert sched.first[it.dst_tensor] <= pos <= done[it.dst_tensor]
            for b in sends:
                for it in b.items:
                    assert done[it.src_tensor] >= pos
        for at, due in sched.copies.items():
            for c in due:
                assert done[c.src_tensor] >= at and done[c.dst_tensor] >= at
                assert all(pos <= at for pos, (_, _, recvs) in enumerate(mine)
                           for b in recvs for it in b.items if it.dst_tensor == c.src_tensor)
        held = [sizes[r][n] for n in sched.first]
        assert (max(held, default=0) <= peaks[r] <= sum(sizes[r].values())), (peaks[r], held)
