"""Hand-checked plans (DCP-style: exact boxes, checked by hand on a few elements)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from plan_helpers import local, shard_box, sharded_side, side_of

from weightbridge.layout.ir import LocalTensor, Piece
from weightbridge.plan import (
    PRESETS,
    Bucket,
    PlanProblem,
    Round,
    build_plan,
    network_model,
    plan_metrics,
    validate_plan,
)
from weightbridge.plan.geometry import map_to_local, split_box, subtract

MiB = 1 << 20


def kinds(problems: list[PlanProblem]) -> set[str]:
    return {p.kind for p in problems}


def test_plan_package_does_not_import_torch():
    import subprocess

    code = "import sys, weightbridge.plan, weightbridge.plan.render; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_row_sharded_two_to_column_sharded_two_exact_items():
    # trainer: W[8, 4] rows 0:4 on rank 0, 4:8 on rank 1; rollout: columns 0:2 on rank 0, 2:4 on rank 1
    tr = sharded_side("trainer", [("W", (8, 4), 0)], shards=2)
    ro = sharded_side("rollout", [("W", (8, 4), 1)], shards=2)
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="off")
    assert validate_plan(plan, tr, ro) == []
    got = sorted((it.sender, it.receiver, it.canonical_box, it.src_box, it.dst_box) for it in plan.items())
    assert got == [
        (0, 0, ((0, 4), (0, 2)), ((0, 4), (0, 2)), ((0, 4), (0, 2))),
        (0, 1, ((0, 4), (2, 4)), ((0, 4), (2, 4)), ((0, 4), (0, 2))),
        (1, 0, ((4, 8), (0, 2)), ((0, 4), (0, 2)), ((4, 8), (0, 2))),
        (1, 1, ((4, 8), (2, 4)), ((0, 4), (2, 4)), ((4, 8), (0, 2))),
    ]
    assert plan.wire_bytes == plan.min_wire_bytes == 8 * 4 * 2
    assert all(it.dtype == "bfloat16" and it.nbytes == 16 for it in plan.items())


def test_dp_replicas_split_the_work_evenly():
    # 2 replicas of a [10, 3] tensor, one receiver needing all of it: rows 5 and 5
    tr = sharded_side("trainer", [("W", (10, 3), None)], shards=1, replicas=2)
    ro = sharded_side("rollout", [("W", (10, 3), None)], shards=1)
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="off")
    assert validate_plan(plan, tr, ro) == []
    per = plan.sender_bytes()
    assert per == {0: 5 * 3 * 2, 1: 5 * 3 * 2}
    boxes = sorted(it.canonical_box for it in plan.items())
    assert boxes == [((0, 5), (0, 3)), ((5, 10), (0, 3))]


def test_fp32_master_to_bf16_rollout_sends_bf16():
    tr = sharded_side("trainer", [("W", (4, 4), None)], shards=1, dtype="float32")
    ro = sharded_side("rollout", [("W", (4, 4), None)], shards=1, dtype="bfloat16")
    plan = build_plan(tr, ro, round_bytes=MiB)
    (it,) = list(plan.items())
    assert it.dtype == "bfloat16" and it.nbytes == 32
    assert validate_plan(plan, tr, ro) == []


def test_transposed_receiver_piece():
    tr = side_of("trainer", [[local("W", ((0, 4), (0, 6)))]])
    ro = side_of("rollout", [[local("W", ((0, 4), (0, 6)), local_name="Wt", transpose=True)]])
    plan = build_plan(tr, ro, round_bytes=MiB)
    (it,) = list(plan.items())
    assert it.dst_transpose and it.dst_box == ((0, 6), (0, 4)) and not it.src_transpose
    assert validate_plan(plan, tr, ro) == []


def test_receiver_holding_an_element_twice_gets_it_once_plus_a_local_copy():
    tied = [local("E", ((0, 8), (0, 2)), local_name="embed"), local("E", ((0, 8), (0, 2)), local_name="lm_head")]
    tr = side_of("trainer", [[local("E", ((0, 8), (0, 2)))]])
    ro = side_of("rollout", [tied])
    plan = build_plan(tr, ro, round_bytes=MiB)
    assert plan.wire_bytes == plan.min_wire_bytes == 8 * 2 * 2
    assert len(plan.local_copies) == 1
    c = plan.local_copies[0]
    assert (c.src_tensor, c.dst_tensor, c.canonical_box) == ("embed", "lm_head", ((0, 8), (0, 2)))
    assert validate_plan(plan, tr, ro) == []


def test_squeezed_expert_slot_mapping():
    # rollout w13 [2, 2I, H] holds gate (rows 0:I) and up (rows I:2I) of expert e in slot e
    I, H = 3, 4
    pieces = []
    for e in range(2):
        pieces.append(Piece(f"e{e}.gate", ((0, I), (0, H)), ((e, e + 1), (0, I), (0, H))))
        pieces.append(Piece(f"e{e}.up", ((0, I), (0, H)), ((e, e + 1), (I, 2 * I), (0, H))))
    ro = side_of("rollout", [[LocalTensor("w13", (2, 2 * I, H), "bfloat16", tuple(pieces))]])
    tr = side_of("trainer", [[local(f"e{e}.{p}", ((0, I), (0, H))) for e in range(2) for p in ("gate", "up")]])
    plan = build_plan(tr, ro, round_bytes=MiB)
    assert validate_plan(plan, tr, ro) == []
    up1 = [it for it in plan.items() if it.canonical == "e1.up"]
    assert [it.dst_box for it in up1] == [((1, 2), (I, 2 * I), (0, H))]


def test_small_cap_splits_tensors_and_respects_the_cap():
    tr = sharded_side("trainer", [("W", (64, 16), 0)], shards=2, dtype="float32")
    ro = sharded_side("rollout", [("W", (64, 16), 1)], shards=2, instances=2, dtype="float32")
    cap = 1024
    plan = build_plan(tr, ro, round_bytes=cap, receiver_dedup="off")
    assert validate_plan(plan, tr, ro) == []
    assert plan.num_rounds >= plan.min_wire_bytes // (2 * cap)
    m = plan_metrics(plan, tr, ro, network=PRESETS["h100"])
    assert m["max_round_rank_bytes"] <= cap


def test_validate_reports_every_problem_at_once():
    tr = sharded_side("trainer", [("A", (4, 4), None)], shards=1)
    ro = side_of("rollout", [[local("A", ((0, 4), (0, 4))), local("B", ((0, 2),), dtype="int32")]])
    plan = build_plan(tr, ro, round_bytes=MiB)
    problems = validate_plan(plan, tr, ro)
    assert kinds(problems) == {"uncovered"}
    assert "B" in problems[0].message
    # tamper: duplicate a bucket (pieces overlap at the receiver), change a dtype, break bounds
    (rnd,) = plan.rounds
    (b,) = rnd.buckets
    it = b.items[0]
    bad_dtype = it._replace(dtype="float32", nbytes=it.nbytes * 2)
    bad_box = it._replace(dst_box=((2, 6), (0, 4)))
    rounds = (Round(0, (b, Bucket(b.src_side, b.sender, b.receiver, (bad_dtype, bad_box), it.nbytes * 3))),)
    bad = dataclasses.replace(plan, rounds=rounds)
    got = kinds(validate_plan(bad, tr, ro))
    assert {"uncovered", "duplicate", "dtype", "bounds", "mapping"} <= got


def test_round_cap_violation_is_reported():
    tr = sharded_side("trainer", [("A", (16, 16), None)], shards=1)
    ro = sharded_side("rollout", [("A", (16, 16), None)], shards=1)
    plan = build_plan(tr, ro, round_bytes=MiB)
    tight = dataclasses.replace(plan, round_bytes=100)
    assert "round-cap" in kinds(validate_plan(tight, tr, ro))


def test_receiver_dedup_on_forwards_between_instances_and_stays_exact():
    tr = sharded_side("trainer", [("W", (32, 8), None), ("b", (8,), None)], shards=1)
    ro = sharded_side("rollout", [("W", (32, 8), 0), ("b", (8,), None)], shards=2, instances=4)
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="on")
    assert plan.receiver_dedup and plan.exchange_bytes > 0
    assert validate_plan(plan, tr, ro) == []
    assert plan.wire_bytes == plan.min_wire_bytes
    assert plan.update_bytes * 4 == plan.min_wire_bytes


def test_receiver_dedup_auto_follows_the_cost_model():
    # one trainer rank, 8 single-GPU instances on one node: the trainer NIC is the bottleneck, NVLink is not
    tr = sharded_side("trainer", [("W", (4096, 1024), None)], shards=1)
    ro = sharded_side("rollout", [("W", (4096, 1024), None)], shards=1, instances=8)
    on = build_plan(tr, ro, round_bytes=64 * MiB)
    assert on.receiver_dedup and "on" in on.notes[0]
    assert validate_plan(on, tr, ro) == []
    # 8 trainer ranks, 2 instances on separate nodes: the rollout NICs are the bottleneck either way
    tr8 = sharded_side("trainer", [("W", (4096, 1024), 0)], shards=8)
    ro2 = sharded_side("rollout", [("W", (4096, 1024), None)], shards=1, instances=2)
    sparse = network_model({"preset": "h100", "ranks_per_node": 1})
    off = build_plan(tr8, ro2, round_bytes=64 * MiB, network=sparse)
    assert not off.receiver_dedup and "off" in off.notes[0]
    assert validate_plan(off, tr8, ro2) == []


def test_plan_is_frozen_printable_and_hashable():
    tr = sharded_side("trainer", [("W", (8, 4), 0)], shards=2)
    ro = sharded_side("rollout", [("W", (8, 4), 1)], shards=2)
    a = build_plan(tr, ro, round_bytes=MiB)
    b = build_plan(tr, ro, round_bytes=MiB)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert len(a.plan_hash) == 64
    assert "W[0:4, 0:2]" in str(a)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.round_bytes = 1  # type: ignore[misc]
    c = build_plan(tr, ro, round_bytes=64)
    assert c != a
    assert a.to_json()["plan_hash"] == a.plan_hash


def test_bad_arguments_raise():
    tr = sharded_side("trainer", [("W", (8, 4), 0)], shards=2)
    with pytest.raises(ValueError):
        build_plan(tr, tr, round_bytes=0)
    with pytest.raises(ValueError):
        build_plan(tr, tr, round_bytes=10, receiver_dedup="maybe")  # type: ignore[arg-type]


def test_geometry_helpers():
    assert subtract(((0, 4), (0, 4)), ((1, 3), (0, 4))) == [((0, 1), (0, 4)), ((3, 4), (0, 4))]
    assert subtract(((0, 2),), ((2, 3),)) == [((0, 2),)]
    parts = split_box(((0, 10), (0, 3)), 7)
    assert parts == [((0, 2), (0, 3)), ((2, 4), (0, 3)), ((4, 6), (0, 3)), ((6, 8), (0, 3)), ((8, 10), (0, 3))]
    assert split_box(((0, 2), (0, 10)), 4) == [((0, 1), (0, 4)), ((0, 1), (4, 7)), ((0, 1), (7, 10)),
                                                ((1, 2), (0, 4)), ((1, 2), (4, 7)), ((1, 2), (7, 10))]
    # a flattened local view: rows of a [4, 6] box as a [24] local tensor
    p = Piece("W", ((0, 4), (0, 6)), ((0, 24),))
    assert map_to_local(((1, 3), (0, 6)), p) == [(((1, 3), (0, 6)), ((6, 18),))]
    assert len(map_to_local(((1, 3), (0, 3)), p)) == 2
    assert shard_box((10, 4), 0, 3, 2) == ((6, 10), (0, 4))


def test_network_spec_presets_and_overrides():
    from weightbridge.plan import NetworkSpec

    m = NetworkSpec.parse({"preset": "h200", "nic_gbit_per_s": 200, "ranks_per_node": 4}).to_model()
    assert m.nic_bytes_per_s == 25e9 and m.ranks_per_node == 4 and m.name == "h200"
    assert network_model("cpu-gloo").nic_bytes_per_s < network_model(None).nic_bytes_per_s
    with pytest.raises(ValueError):
        NetworkSpec.parse({"preset": "tpu"})
    with pytest.raises(ValueError):
        NetworkSpec.parse({"nic": 3})


def test_cost_model_prices_links_and_baseline():
    from weightbridge.plan.cost import baseline, price

    tr = sharded_side("trainer", [("W", (1024, 1024), 0)], shards=2)
    ro = sharded_side("rollout", [("W", (1024, 1024), 0)], shards=2)
    plan = build_plan(tr, ro, round_bytes=64 * MiB)
    half = 512 * 1024 * 2  # bytes of one shard
    apart = network_model("h100")
    pred, bound = price(plan, apart)
    assert bound == pytest.approx(half / apart.nic_bytes_per_s)
    assert pred == pytest.approx(bound + apart.message_latency_s)  # one bucket per rank, one round
    together = network_model("h100", colocated=True)  # trainer rank i and rollout rank i share GPU i
    assert price(plan, together)[1] == pytest.approx(half / together.intra_node_bytes_per_s)
    base = baseline(tr, ro, apart)  # one stage: gather the other half on one node, broadcast everything
    assert base.gather_seconds == pytest.approx(half / apart.intra_node_bytes_per_s)
    assert base.broadcast_seconds == pytest.approx(2 * half / apart.nic_bytes_per_s + apart.message_latency_s)
    m = plan_metrics(plan, tr, ro, network=apart, sync_mode="async", max_staleness=1)
    assert m["stall_seconds"] < m["predicted_seconds"] < m["baseline_stall_seconds"]


def test_shared_nodes_and_the_host_cap_price_one_host():
    """``shared_nodes``: trainer and rollout ranks on one node move over the intra-node link;
    ``node_bytes_per_s``: all of a node's intra-node bytes together bound a round."""
    from weightbridge.plan.cost import price

    tr = sharded_side("trainer", [("W", (1024, 1024), 0)], shards=2)
    ro = sharded_side("rollout", [("W", (1024, 1024), 0)], shards=2)
    plan = build_plan(tr, ro, round_bytes=64 * MiB)
    half = 512 * 1024 * 2
    link_only = network_model({"preset": "h100", "shared_nodes": True})
    assert price(plan, link_only)[1] == pytest.approx(half / link_only.intra_node_bytes_per_s)
    host = network_model({"preset": "cpu-gloo", "node_gbyte_per_s": 1.0})  # both transfers share the 1 GB/s host
    assert host.shared_nodes and price(plan, host)[1] == pytest.approx(2 * half / 1e9)
    apart = network_model({"preset": "cpu-gloo", "shared_nodes": False})  # the sides on separate hosts: NICs
    assert price(plan, apart)[1] == pytest.approx(half / apart.nic_bytes_per_s)


def test_receiver_dedup_pays_across_nodes_and_not_on_one_host():
    """Two instances of the same layout: forwarding between them halves what crosses the NICs (on),
    but on one host it only adds bytes to the same loopback (off)."""
    tr = sharded_side("trainer", [("W", (4096, 1024), 0)], shards=2)
    ro = sharded_side("rollout", [("W", (4096, 1024), 0)], shards=2, instances=2)
    on_gpus = build_plan(tr, ro, round_bytes=64 * MiB, network=network_model("h100"))
    one_host = build_plan(tr, ro, round_bytes=64 * MiB, network=network_model("cpu-gloo"))
    assert on_gpus.receiver_dedup and not one_host.receiver_dedup, (on_gpus.notes, one_host.notes)


@pytest.mark.parametrize("dedup", ["off", "on"])
def test_empty_shards_are_ignored(dedup):
    # 2 rows over 3 trainer ranks and 4 rollout ranks: some shards hold nothing
    tr = sharded_side("trainer", [("W", (2, 4), 0)], shards=3)
    ro = sharded_side("rollout", [("W", (2, 4), 0)], shards=4, instances=2)
    plan = build_plan(tr, ro, round_bytes=64, receiver_dedup=dedup)
    assert validate_plan(plan, tr, ro) == []
    assert plan.wire_bytes == plan.min_wire_bytes == 2 * 2 * 4 * 2
