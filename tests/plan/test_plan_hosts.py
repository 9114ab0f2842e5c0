"""Plans on hosts (``network.hosts``, ``nics_per_node``): relay groups per host, bytes balanced over NICs.

What a multi-host plan must do (issue 32): every byte a rollout host needs enters it at most once
(receiver de-replication forwards inside the host: relay groups), and the trainers' bytes are
balanced over their hosts' NICs, not only over ranks. The cluster measures the same plans on shaped
links (``tests/cluster/``, ``bench/cluster.py``); these check the plans themselves.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import layout_pairs, sharded_side
from test_plan_properties import SETTINGS

from weightbridge.plan import build_plan, build_rank_plan, validate_plan
from weightbridge.plan.cost import price
from weightbridge.plan.network import PRESETS, NetworkSpec, network_model
from weightbridge.plan.types import ROLLOUT, TRAINER
from weightbridge.spec.resolve import check_text

GBIT = 1e9 / 8


def hosts_net(hosts, nics_per_node=1):
    return dataclasses.replace(PRESETS["cpu-gloo"], hosts=tuple(hosts), nics_per_node=nics_per_node,
                               nic_bytes_per_s=GBIT)


def entering(plan, net) -> dict:
    """Bytes crossing into each host from another host, from the plan's buckets."""
    out: dict = {}
    for _, b in plan.buckets():
        src, dst = net.node_of(b.src_side, b.sender), net.node_of(ROLLOUT, b.receiver)
        if src != dst:
            out[dst] = out.get(dst, 0) + b.nbytes
    return out


def nic_out(plan, net, side=TRAINER) -> dict:
    out: dict = {}
    for _, b in plan.buckets():
        if b.src_side == side and net.node_of(side, b.sender) != net.node_of(ROLLOUT, b.receiver):
            key = net.nic_of(side, b.sender)
            out[key] = out.get(key, 0) + b.nbytes
    return out


def slot_needs(trainer, rollout) -> dict:
    """Rollout rank -> bytes it needs (a plan without de-replication sends each exactly that)."""
    plan = build_plan(trainer, rollout, round_bytes=1 << 30, receiver_dedup="off")
    got = plan.receiver_bytes()
    return {lay.rank: got.get(lay.rank, 0) for lay in rollout.ranks}


@st.composite
def placed_pairs(draw):
    """A random layout pair and random hosts: trainer and rollout ranks cut into consecutive runs."""
    trainer, rollout, cap = draw(layout_pairs())
    nhosts = draw(st.integers(1, 4))

    def cuts(n: int) -> list[int]:
        points = sorted(draw(st.lists(st.integers(0, n), min_size=nhosts - 1, max_size=nhosts - 1)))
        edges = [0, *points, n]
        return [edges[i + 1] - edges[i] for i in range(nhosts)]

    shared = draw(st.booleans())
    t = cuts(trainer.world_size)
    r = cuts(rollout.world_size)
    hosts = list(zip(t, r)) if shared else [(x, 0) for x in t] + [(0, x) for x in r]
    return trainer, rollout, cap, hosts


@SETTINGS
@given(placed_pairs())
def test_each_byte_enters_each_host_at_most_once_with_receiver_dedup(case):
    trainer, rollout, cap, hosts = case
    net = hosts_net(hosts)
    plan = build_plan(trainer, rollout, round_bytes=cap, network=net, receiver_dedup="on")
    assert validate_plan(plan, trainer, rollout) == []
    assert plan.wire_bytes == plan.min_wire_bytes
    need = slot_needs(trainer, rollout)
    from weightbridge.plan.instances import group_instances

    by_host: dict = {}  # host -> {(template, slot): bytes}: what the host's ranks need, once per slot
    for g, tpl in enumerate(group_instances(rollout)):
        for ranks in tpl.ranks:
            for slot, r in enumerate(ranks):
                by_host.setdefault(net.node_of(ROLLOUT, r), {})[(g, slot)] = need[r]
    got = entering(plan, net)
    trainer_hosts = {net.node_of(TRAINER, s) for s in range(trainer.world_size)}
    for host, slots in by_host.items():
        once = sum(slots.values())
        assert got.get(host, 0) <= once, (host, got, slots, hosts)
        if host not in trainer_hosts:  # nothing it needs is at home: all of it enters, exactly once
            assert got.get(host, 0) == once, (host, got, slots, hosts)
    # forwarding stays inside hosts
    for _, b in plan.buckets():
        if b.src_side == ROLLOUT:
            assert net.node_of(ROLLOUT, b.sender) == net.node_of(ROLLOUT, b.receiver), b


def test_four_instances_on_two_hosts_relay_inside_each_host():
    """FSDP2 dp 4 on two hosts -> TP2 x 4 on two hosts: each rollout host takes the model once."""
    tensors = [("w", (2048, 512), 0), ("v", (512, 256), 1)]
    trainer = sharded_side("trainer", tensors, shards=4)
    rollout = sharded_side("rollout", tensors, shards=2, instances=4)
    net = hosts_net([(2, 0), (2, 0), (0, 4), (0, 4)])
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, network=net, receiver_dedup="auto")
    assert plan.receiver_dedup and "receiver de-replication on" in plan.notes[0]
    model = (2048 * 512 + 512 * 256) * 2
    assert entering(plan, net) == {("host", 2): model, ("host", 3): model}
    assert nic_out(plan, net) == {(("host", 0), 0): model, (("host", 1), 0): model}
    # the lower bound is the busiest link: one model through each NIC at 1 Gbit/s
    assert price(plan, net)[1] == model / GBIT
    # before relay groups (all instances one group) host 3 took host 2's forwards: 2 more copies
    flat = dataclasses.replace(net, hosts=((2, 0), (2, 0), (0, 8)))
    plan_flat = build_plan(trainer, rollout, round_bytes=1 << 20, network=flat, receiver_dedup="on")
    assert sum(entering(plan_flat, flat).values()) == model  # one host: the model enters once
    # every rank's slice is the global plan's
    for side, n in ((TRAINER, 4), (ROLLOUT, 8)):
        for rank in range(n):
            mine = build_rank_plan(trainer, rollout, side=side, rank=rank, round_bytes=1 << 20, network=net)
            want = sorted((r.index, b) for r in plan.rounds for b in r.buckets
                          if (b.src_side == side and b.sender == rank) or (side == ROLLOUT and b.receiver == rank))
            assert sorted((r.index, b) for r in mine.rounds for b in r.buckets) == want


def test_senders_balance_bytes_over_nics_not_ranks():
    """Four replicas of the model, three on host 0 and one on host 1: each NIC sends half, not 3/4 and 1/4."""
    tensors = [("w", (96, 8), 0), ("v", (48, 4), 0)]
    trainer = sharded_side("trainer", tensors, shards=1, replicas=4)
    rollout = sharded_side("rollout", tensors, shards=1, instances=1)
    net = hosts_net([(3, 0), (1, 0), (0, 1)])
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, network=net, receiver_dedup="off")
    assert validate_plan(plan, trainer, rollout) == []
    model = (96 * 8 + 48 * 4) * 2
    sent = nic_out(plan, net)
    assert sent[(("host", 0), 0)] == sent[(("host", 1), 0)] == model // 2, sent
    per_rank = plan.sender_bytes(TRAINER)
    assert per_rank[3] == model // 2 and sorted(per_rank[r] for r in range(3)) == [model // 6] * 3, per_rank
    # a NIC per rank (the default): every rank sends a quarter
    even = build_plan(trainer, rollout, round_bytes=1 << 20, network=dataclasses.replace(net, nics_per_node=None))
    assert sorted(even.sender_bytes(TRAINER).values()) == [model // 4] * 4


def test_shared_nic_and_hosts_price_one_link_per_host():
    tensors = [("w", (64, 32), 0)]
    trainer = sharded_side("trainer", tensors, shards=2)
    rollout = sharded_side("rollout", tensors, shards=1, instances=1)
    nbytes = 64 * 32 * 2
    one_nic = hosts_net([(2, 0), (0, 1)])
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, network=one_nic)
    assert price(plan, one_nic)[1] == nbytes / GBIT  # both senders share host 0's NIC
    two_nics = hosts_net([(2, 0), (0, 1)], nics_per_node=2)
    assert price(plan, two_nics)[1] == nbytes / GBIT  # the receiver's one NIC binds
    shared = hosts_net([(1, 1), (1, 0)])  # rollout 0 sits next to trainer 0: half stays on loopback
    assert price(plan, shared)[1] == (nbytes / 2) / GBIT


def test_spec_hosts_field_validates_and_reports_every_unplaced_rank():
    base = ("version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2, mesh: {dp: 4}}\n"
            "rollout: {preset: vllm, instances: 4, mesh: {tp: 2}}\n")
    good = base + "network: {preset: cpu-gloo, nics_per_node: 1, hosts: [{trainer: 2, count: 2}, {rollout: 4, count: 2}]}\n"
    r, problems = check_text(good)
    assert problems == [] and network_model(r.network).hosts == ((2, 0), (2, 0), (0, 4), (0, 4))
    bad = base + "network: {preset: cpu-gloo, hosts: [{trainer: 3}, {rollout: 4, count: 3}]}\n"
    r, problems = check_text(bad)
    assert r is None and [(p.path, p.line) for p in problems] == [("$.network.hosts", 5)] * 2
    assert "3 trainer rank(s), the trainer has 4" in problems[0].message
    assert "12 rollout rank(s), the rollout has 8" in problems[1].message
    many = "[" + ", ".join(["{trainer: 0, count: 40000}"] * 2) + ", {trainer: 4}, {rollout: 8}]"
    r, problems = check_text(base + f"network: {{preset: cpu-gloo, hosts: {many}}}\n")
    assert r is None and "80002 hosts, more than 65536" in problems[0].message
    r, problems = check_text(base + "network: {preset: cpu-gloo, hosts: [{trainer: -1}]}\n")
    assert r is None and problems[0].path.startswith("$.network.hosts")
    assert NetworkSpec.parse({"hosts": [{"rollout": 2}]}).to_model().node_of(ROLLOUT, 5) == (ROLLOUT, "beyond", 5)


@SETTINGS
@given(placed_pairs(), st.sampled_from(["off", "on", "auto"]))
def test_every_rank_plan_on_hosts_is_its_slice_of_the_global_plan(case, dedup):
    from weightbridge.plan.types import rank_slice

    trainer, rollout, cap, hosts = case
    net = hosts_net(hosts)
    plan = build_plan(trainer, rollout, round_bytes=cap, network=net, receiver_dedup=dedup)
    assert validate_plan(plan, trainer, rollout) == []
    for side, lay in ((TRAINER, trainer), (ROLLOUT, rollout)):
        for r in range(lay.world_size):
            rp = build_rank_plan(trainer, rollout, side=side, rank=r, round_bytes=cap, network=net, receiver_dedup=dedup)
            rounds, copies = rank_slice(plan, side, r)
            assert (rp.rounds, rp.local_copies) == (rounds, copies), (side, r)
