"""Per-rank planning: every rank's ``build_rank_plan`` is exactly its slice of ``build_plan``'s plan.

Random layout pairs (test_plan_properties' strategy), and random data-parallel trainers with
identical rollout instances, where the plan splits into replica groups (plan/replicas.py).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import layout_pairs, local_for, shard_box
from test_plan_properties import SETTINGS

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import RankLayout, SideLayout
from weightbridge.plan import build_plan, build_rank_plan, validate_plan
from weightbridge.plan.hashing import plan_inputs_hash
from weightbridge.plan.network import PRESETS
from weightbridge.plan.replicas import decompose
from weightbridge.plan.types import rank_slice


def _assert_every_slice(trainer, rollout, cap, dedup):
    plan = build_plan(trainer, rollout, round_bytes=cap, receiver_dedup=dedup)
    assert validate_plan(plan, trainer, rollout) == []
    hashes = set()
    for side, lay in (("trainer", trainer), ("rollout", rollout)):
        for r in range(lay.world_size):
            rp = build_rank_plan(trainer, rollout, side=side, rank=r, round_bytes=cap, receiver_dedup=dedup)
            rounds, copies = rank_slice(plan, side, r)
            assert rp.rounds == rounds, (side, r)
            assert rp.local_copies == copies, (side, r)
            assert (rp.wire_bytes, rp.min_wire_bytes, rp.receiver_dedup, rp.num_rounds) == (
                plan.wire_bytes, plan.min_wire_bytes, plan.receiver_dedup, plan.num_rounds)
            hashes.add(rp.plan_hash)
    assert len(hashes) == 1
    return plan


@st.composite
def replicated_pairs(draw):
    """A trainer of ``k`` identical data-parallel replicas of ``n`` ranks (interleaved or blocked
    rank order) and ``I`` identical rollout instances: replica groups whenever gcd(k, I) >= 2."""
    ntensors = draw(st.integers(1, 3))
    shapes = [tuple(draw(st.lists(st.integers(1, 8), min_size=nd, max_size=nd))) for nd in
              draw(st.lists(st.integers(1, 3), min_size=ntensors, max_size=ntensors))]
    n = draw(st.integers(1, 3))
    k = draw(st.integers(1, 4))
    tdims = [draw(st.sampled_from([None, *range(len(shape))])) for shape in shapes]
    one = []
    for p in range(n):
        ts = []
        for t, (shape, dim) in enumerate(zip(shapes, tdims)):
            box = shard_box(shape, dim, n, p) if dim is not None else shard_box(shape, None, 1, 0)
            if box_numel(box) and (dim is not None or p == 0 or draw(st.booleans())):
                ts.append(local_for(f"t{t}", box, "bfloat16", draw(st.integers(0, 3)), suffix=f".{p}"))
        one.append(tuple(ts))
    blocked = draw(st.booleans())  # rank = d * n + p, or p * k + d
    ranks = sorted(((d * n + p) if blocked else (p * k + d), one[p]) for d in range(k) for p in range(n))
    trainer = SideLayout("trainer", tuple(RankLayout("trainer", r, ts) for r, ts in ranks))
    inst = draw(st.integers(1, 6))
    width = draw(st.integers(1, 3))
    dims = [draw(st.sampled_from([None, *range(len(s))])) for s in shapes]
    rollout_ranks = []
    slots = [tuple(local_for(f"t{t}", shard_box(s, d, width, l), "bfloat16", 0)
                   for t, (s, d) in enumerate(zip(shapes, dims)) if box_numel(shard_box(s, d, width, l)))
             for l in range(width)]
    for i in range(inst):
        rollout_ranks += [RankLayout("rollout", i * width + l, slots[l], instance=i, local_rank=l) for l in range(width)]
    rollout = SideLayout("rollout", tuple(rollout_ranks), num_instances=inst)
    return trainer, rollout, draw(st.sampled_from([64, 512, 1 << 20])), draw(st.sampled_from(["off", "on", "auto"]))


@SETTINGS
@given(layout_pairs(), st.sampled_from(["off", "on"]))
def test_every_rank_plan_is_its_slice_of_the_global_plan(pair, dedup):
    trainer, rollout, cap = pair
    _assert_every_slice(trainer, rollout, cap, dedup)


@SETTINGS
@given(replicated_pairs())
def test_replica_groups_plan_exactly_and_every_rank_plan_is_its_slice(case):
    trainer, rollout, cap, dedup = case
    plan = _assert_every_slice(trainer, rollout, cap, dedup)
    assert plan.wire_bytes == plan.min_wire_bytes
    if not plan.receiver_dedup:
        assert plan.update_bytes == plan.min_wire_bytes


def test_replica_groups_split_senders_and_instances_evenly():
    """4 replicas of 2 ranks, 6 instances: gcd 2 groups; each rollout rank hears only from its group."""
    shape = (8, 4)
    one = [(local_for("W", shard_box(shape, 0, 2, p), "bfloat16", 0),) for p in range(2)]
    trainer = SideLayout("trainer", tuple(RankLayout("trainer", d * 2 + p, one[p]) for d in range(4) for p in range(2)))
    rollout = SideLayout("rollout", tuple(RankLayout("rollout", i, (local_for("W", ((0, 8), (0, 4)), "bfloat16", 0),),
                                                     instance=i) for i in range(6)), num_instances=6)
    d = decompose(trainer, rollout)
    assert d is not None and d.groups == 2
    assert d.trainer_ranks == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert d.rollout_ranks == ((0, 1, 2), (3, 4, 5))
    plan = build_plan(trainer, rollout, round_bytes=1 << 20, receiver_dedup="off")
    assert validate_plan(plan, trainer, rollout) == []
    heard = {}
    for _, b in plan.buckets():
        heard.setdefault(b.receiver, set()).add(b.sender)
    assert all(s <= {0, 1, 2, 3} for r, s in heard.items() if r < 3)
    assert all(s <= {4, 5, 6, 7} for r, s in heard.items() if r >= 3)
    assert set(plan.sender_bytes().values()) == {8 * 4 * 2 * 3 // 4}  # bf16, 3 instances per group over 4 senders
    assert any(n.startswith("replica groups: 2") for n in plan.notes)


def test_no_replica_groups_when_replicas_and_instances_share_no_factor():
    one = (local_for("W", ((0, 4),), "float32", 0),)
    trainer = SideLayout("trainer", tuple(RankLayout("trainer", r, one) for r in range(3)))
    rollout = SideLayout("rollout", tuple(RankLayout("rollout", i, one, instance=i) for i in range(2)), num_instances=2)
    assert decompose(trainer, rollout) is None
    uneven = SideLayout("trainer", (RankLayout("trainer", 0, one), RankLayout("trainer", 1, one),
                                    RankLayout("trainer", 2, (local_for("V", ((0, 4),), "float32", 0),))))
    assert decompose(uneven, rollout) is None  # classes of 2 and 1 ranks


def test_inputs_hash_covers_layouts_arguments_and_network_not_object_sharing():
    one = (local_for("W", ((0, 4), (0, 2)), "float32", 0),)
    tr = SideLayout("trainer", (RankLayout("trainer", 0, one), RankLayout("trainer", 1, one)))
    tr_copy = SideLayout("trainer", (RankLayout("trainer", 0, tuple(one)), RankLayout("trainer", 1, (one[0]._replace(),))))
    ro = SideLayout("rollout", (RankLayout("rollout", 0, one),))
    h = plan_inputs_hash(tr, ro, 1024, PRESETS["h100"], "auto")
    assert plan_inputs_hash(tr_copy, ro, 1024, PRESETS["h100"], "auto") == h
    assert plan_inputs_hash(tr, ro, 2048, PRESETS["h100"], "auto") != h
    assert plan_inputs_hash(tr, ro, 1024, PRESETS["h200"], "auto") != h
    assert plan_inputs_hash(tr, ro, 1024, PRESETS["h100"], "off") != h
    other = (local_for("W", ((0, 4), (0, 2)), "bfloat16", 0),)
    assert plan_inputs_hash(SideLayout("trainer", (RankLayout("trainer", 0, one), RankLayout("trainer", 1, other))),
                            ro, 1024, PRESETS["h100"], "auto") != h


def test_receiver_dedup_plans_the_update_whole_each_unit_crosses_once():
    """Replica groups would send every unit once per group; with receiver de-replication (forced, or
    chosen by auto on the whole update) the update is planned whole and each unit leaves the trainers once."""
    one = (local_for("W", ((0, 8192), (0, 4096)), "bfloat16", 0),)  # 64 MiB: bandwidth, not latency, decides
    trainer = SideLayout("trainer", tuple(RankLayout("trainer", r, one) for r in range(2)))
    rollout = SideLayout("rollout", tuple(RankLayout("rollout", i, one, instance=i) for i in range(8)), num_instances=8)
    assert decompose(trainer, rollout) is not None
    need = 8192 * 4096 * 2
    off = _assert_every_slice(trainer, rollout, 1 << 30, "off")
    assert off.update_bytes == 8 * need and any(n.startswith("replica groups: 2") for n in off.notes)
    for dedup in ("on", "auto"):  # auto: on the default h100 network 8 instances behind 2 NICs pay off
        plan = _assert_every_slice(trainer, rollout, 1 << 30, dedup)
        assert plan.receiver_dedup and plan.update_bytes == need, (dedup, plan.notes)
        assert not any(n.startswith("replica groups") for n in plan.notes)
    assert any("receiver de-replication on" in n for n in plan.notes)


@SETTINGS
@given(ranks=st.lists(st.integers(0, 40), min_size=0, max_size=12, unique=True),
       preset=st.sampled_from(["h100", "cpu-gloo", "colocated", "rpn3", "hosts"]), nbytes=st.sampled_from([1.0, 7.5, 4096.0]))
def test_all_to_all_links_equal_every_pair_added(ranks, preset, nbytes):
    """The receiver de-replication estimate prices forwarding in O(instances), as the pairs would add."""
    import dataclasses

    from weightbridge.plan.cost import Links

    net = {"colocated": PRESETS["h100"].with_colocated(True),
           "rpn3": dataclasses.replace(PRESETS["h100"], ranks_per_node=3),
           "hosts": dataclasses.replace(PRESETS["h100"], hosts=((0, 5), (2, 7), (0, 30)), nics_per_node=2),
           }.get(preset) or PRESETS[preset]
    fast, pairs = Links(net), Links(net)
    fast.add_all_to_all("rollout", ranks, nbytes)
    for a in ranks:
        for b in ranks:
            if a != b:
                pairs.add("rollout", a, "rollout", b, nbytes)
    for field in ("nic_out", "nic_in", "nv_out", "nv_in", "node_tot", "msgs"):
        assert getattr(fast, field) == getattr(pairs, field), field
