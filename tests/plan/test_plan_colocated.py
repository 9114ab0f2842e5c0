"""The planner with the colocated data plane: each receiver's boxes from the holder on its GPU, shared
memory priced at memory bandwidth (``NetworkModel.local_copy``, from ``sync.transport``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from plan_helpers import layout_pairs, sharded_side

from weightbridge.plan import build_plan, build_rank_plan, validate_plan
from weightbridge.plan.cost import price
from weightbridge.plan.network import local_copy_of, network_model

TENSORS = [("w", (64, 32), 0), ("b", (64,), 0)]


def _sides(replicas: int = 2):
    """Trainer TP2 x DP ``replicas`` (rank = replica * 2 + shard), one rollout instance of TP2: each rollout
    rank's shard has ``replicas`` holders, trainer ranks 0 and 1 on the rollout ranks' own GPUs (colocated)."""
    return (sharded_side("trainer", TENSORS, shards=2, replicas=replicas),
            sharded_side("rollout", TENSORS, shards=2, instances=1))


def _senders(plan) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for _, b in plan.buckets():
        out.setdefault(b.receiver, set()).add(b.sender)
    return out


def test_each_receiver_takes_its_boxes_from_the_holder_on_its_gpu():
    trainer, rollout = _sides()
    net = network_model("h100", colocated=True, local_copy=local_copy_of("auto"))
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, network=net, receiver_dedup="off")
    assert validate_plan(plan, trainer, rollout) == []
    assert _senders(plan) == {0: {0}, 1: {1}}  # trainer r and rollout r share GPU r
    # the wire (transport nccl) balances the same boxes over both replicas, as before
    wire = build_plan(trainer, rollout, round_bytes=1 << 20, receiver_dedup="off",
                      network=network_model("h100", colocated=True, local_copy=local_copy_of("nccl")))
    assert _senders(wire) == {0: {0, 2}, 1: {1, 3}}
    # every rank's slice is cut from that same plan
    for side, n in (("trainer", 4), ("rollout", 2)):
        for rank in range(n):
            mine = build_rank_plan(trainer, rollout, side=side, rank=rank, round_bytes=1 << 20, network=net,
                                   receiver_dedup="off")
            got = sorted(b for _, b in mine.buckets())
            want = sorted(b for _, b in plan.buckets() if (b.sender == rank if side == "trainer" else b.receiver == rank))
            assert got == want


def test_on_one_host_every_holder_is_near_and_the_bytes_stay_balanced():
    """shm on a CPU host: every pair is local (host), no holder is nearer than another: the split over the
    replicas is the wire's (balance is kept), only the pricing changes."""
    trainer, rollout = _sides()
    shm = network_model("cpu-gloo", local_copy=local_copy_of("shm"))
    gloo = network_model("cpu-gloo", local_copy=local_copy_of("gloo"))
    a = build_plan(trainer, rollout, round_bytes=1 << 20, network=shm, receiver_dedup="off")
    b = build_plan(trainer, rollout, round_bytes=1 << 20, network=gloo, receiver_dedup="off")
    assert a.rounds == b.rounds and _senders(a) == {0: {0, 2}, 1: {1, 3}}
    # priced at memory bandwidth: each byte is copied into a slab and out of it, per copying rank
    busiest = max(max(a.sender_bytes().values()), max(a.receiver_bytes().values()))
    predicted, bound = price(a, shm)
    assert bound == pytest.approx(busiest / shm.hbm_bytes_per_s)
    assert price(b, gloo)[1] > bound  # Gloo's loopback (3.6 GB/s a rank) is slower than a memcpy


def test_colocated_pairs_on_one_gpu_copy_twice_through_its_memory():
    trainer, rollout = _sides(replicas=1)
    net = network_model("h100", colocated=True, local_copy="gpu")
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, network=net, receiver_dedup="off")
    per_gpu = max(plan.sender_bytes().values())
    assert price(plan, net)[1] == pytest.approx(2 * per_gpu / net.hbm_bytes_per_s)


def test_local_copy_is_part_of_the_plan_hash_and_checked():
    trainer, rollout = _sides()
    hashes = {build_rank_plan(trainer, rollout, side="trainer", rank=0, round_bytes=1 << 20,
                              network=network_model("h100", local_copy=lc)).plan_hash for lc in ("off", "gpu", "host")}
    assert len(hashes) == 3
    with pytest.raises(ValueError, match="local_copy"):
        network_model("h100", local_copy="everything")


@settings(max_examples=int(os.environ.get("WB_HYPO", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs())
def test_nearest_holders_still_cover_every_element_exactly_once(pair):
    trainer, rollout, cap = pair
    for net in (network_model("h100", colocated=True, local_copy="gpu"),
                network_model("h100", local_copy="host").__class__(ranks_per_node=2, local_copy="host")):
        plan = build_plan(trainer, rollout, round_bytes=cap, network=net, receiver_dedup="off")
        assert validate_plan(plan, trainer, rollout) == []
        assert plan.wire_bytes == plan.update_bytes == plan.min_wire_bytes
