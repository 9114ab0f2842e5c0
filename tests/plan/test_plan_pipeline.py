"""The planner as a pipeline of typed values: the steps, the content hash, the validator's every check."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from plan_helpers import sharded_side

from weightbridge.layout.ir import CanonicalModel, CanonicalTensor
from weightbridge.plan import Bucket, PlanError, Round, TransferPlan, build_plan, network_model, validate_plan
from weightbridge.plan.assemble import assemble
from weightbridge.plan.cost import Links, price
from weightbridge.plan.cover import Cover, cover_needs
from weightbridge.plan.decide import DedupDecision, decide_receiver_dedup
from weightbridge.plan.dereplicate import ALL_INSTANCES, ForwardPacket, Packets, UpdatePacket, make_packets
from weightbridge.plan.instances import group_instances
from weightbridge.plan.rounds import Schedule, pack
from weightbridge.plan.sources import index_sources
from weightbridge.plan.types import ROLLOUT

MiB = 1 << 20
PLAN_DIR = Path(__file__).resolve().parents[2] / "weightbridge" / "plan"


def _pair(instances: int = 1):
    tr = sharded_side("trainer", [("W", (8, 4), None)], shards=1)
    ro = sharded_side("rollout", [("W", (8, 4), 0)], shards=2, instances=instances)
    return tr, ro


# ---------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------


def test_steps_compose_to_build_plan_with_named_values():
    tr = sharded_side("trainer", [("W", (32, 8), None), ("b", (8,), None)], shards=1, replicas=2)
    ro = sharded_side("rollout", [("W", (32, 8), 0), ("b", (8,), None)], shards=2, instances=3)
    atoms = index_sources(tr)
    templates = group_instances(ro)
    assert len(templates) == 1 and len(templates[0].ranks) == 3
    cover = cover_needs(templates, atoms)
    assert isinstance(cover, Cover) and cover.min_wire_bytes == 3 * (32 * 8 + 2 * 8) * 2
    decision = decide_receiver_dedup(cover, templates, network_model("h100"))
    assert isinstance(decision, DedupDecision) and decision.note.startswith("receiver de-replication")
    packets = make_packets(cover, templates, [True], MiB)
    assert isinstance(packets, Packets) and packets.forwards
    assert all(isinstance(p, UpdatePacket) and p.instance != ALL_INSTANCES for p in packets.updates)
    assert all(isinstance(p, ForwardPacket) and p.after for p in packets.forwards)
    schedule = pack(packets, templates, MiB)
    assert isinstance(schedule, Schedule)
    assert len(schedule.update_rounds) == len(packets.updates)
    assert len(schedule.forward_rounds) == len(packets.forwards)
    for f, rho in zip(packets.forwards, schedule.forward_rounds):  # forwards go after what they forward
        assert rho > max(schedule.update_rounds[i] for i in f.after)
    rounds = assemble(packets, schedule, templates)
    built = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="on")
    assert rounds == built.rounds
    assert built.local_copies == cover.copies and built.max_sender_bytes_bound == packets.sender_bound


def test_plan_modules_have_no_import_cycle_and_stay_small():
    graph: dict[str, set[str]] = {}
    for path in PLAN_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 450, path
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("weightbridge.plan."):
                deps.add(node.module.rsplit(".", 1)[1])
        graph[path.stem] = deps
    state: dict[str, int] = {}

    def visit(m: str, trail: tuple[str, ...]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, f"import cycle: {' -> '.join(trail + (m,))}"
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, trail + (m,))
        state[m] = 2

    for m in sorted(graph):
        visit(m, ())


def test_bad_arguments_raise_plan_error():
    tr, ro = _pair()
    with pytest.raises(PlanError, match="round_bytes"):
        build_plan(tr, ro, round_bytes=-1)
    with pytest.raises(PlanError, match="receiver_dedup"):
        build_plan(tr, ro, round_bytes=MiB, receiver_dedup="yes")  # type: ignore[arg-type]


def test_planning_seconds_is_not_part_of_the_plan():
    assert "planning_seconds" not in {f.name for f in dataclasses.fields(TransferPlan)}


def test_price_is_links_round_by_round():
    tr = sharded_side("trainer", [("W", (64, 16), 0)], shards=2, dtype="float32")
    ro = sharded_side("rollout", [("W", (64, 16), 1)], shards=2, instances=2, dtype="float32")
    plan = build_plan(tr, ro, round_bytes=1024, receiver_dedup="off")
    assert plan.num_rounds > 1
    net = network_model("h100", colocated=True)
    want_pred, total = 0.0, Links(net)
    for r in plan.rounds:
        links = Links(net)
        for b in r.buckets:
            links.add(b.src_side, b.sender, ROLLOUT, b.receiver, b.nbytes)
            total.add(b.src_side, b.sender, ROLLOUT, b.receiver, b.nbytes)
        want_pred += links.wire_seconds() + links.latency_seconds()
    assert price(plan, net) == pytest.approx((want_pred, total.wire_seconds()))


# ---------------------------------------------------------------------------
# the hash is a function of content
# ---------------------------------------------------------------------------


def _unshared(plan: TransferPlan) -> TransferPlan:
    """The same plan with every item, box and tuple a fresh copy (no object shared with ``plan``)."""

    def box(b):
        return tuple(tuple([a, z]) for a, z in b)

    def item(it):
        return type(it)(*[box(v) if isinstance(v, tuple) else v for v in it])

    rounds = tuple(Round(r.index, tuple(Bucket(b.src_side, b.sender, b.receiver, tuple(item(it) for it in b.items),
                                               b.nbytes) for b in r.buckets)) for r in plan.rounds)
    copies = tuple(item(c) for c in plan.local_copies)
    return dataclasses.replace(plan, rounds=rounds, local_copies=copies)


def test_equal_content_with_unshared_tuples_hashes_equal():
    tr, ro = _pair(instances=3)  # one template: its buckets share one item tuple object
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="off")
    tuples = [b.items for r in plan.rounds for b in r.buckets]
    assert len({id(t) for t in tuples}) < len(tuples)  # the builder does share them
    copy = _unshared(plan)
    assert all(a.items is not b.items for r, s in zip(plan.rounds, copy.rounds) for a, b in zip(r.buckets, s.buckets))
    assert copy.plan_hash == plan.plan_hash and copy == plan and hash(copy) == hash(plan)


def test_changed_rounds_hash_differently_and_replace_rehashes():
    tr, ro = _pair(instances=2)
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="off")
    (rnd,) = plan.rounds
    swapped = dataclasses.replace(plan, rounds=(Round(0, rnd.buckets[1:]), Round(1, rnd.buckets[:1])))
    assert swapped.plan_hash != plan.plan_hash and swapped != plan
    b = rnd.buckets[0]
    it = b.items[0]
    moved = it._replace(dst_box=((0, 4), (0, 4)), canonical_box=((4, 8), (0, 4)))
    edited = dataclasses.replace(plan, rounds=(Round(0, (b._replace(items=(moved,)), *rnd.buckets[1:])),))
    assert edited.plan_hash != plan.plan_hash
    assert dataclasses.replace(plan, round_bytes=MiB + 1).plan_hash != plan.plan_hash
    assert dataclasses.replace(plan).plan_hash == plan.plan_hash
    with pytest.raises(TypeError):
        TransferPlan(plan.rounds, plan.local_copies, MiB, 1, 4, False, 0, 0, plan_hash="x")  # type: ignore[call-arg]


# ---------------------------------------------------------------------------
# every validator check catches its own problem (each test fails when its check is removed)
# ---------------------------------------------------------------------------


def _valid():
    tr = sharded_side("trainer", [("W", (8, 4), None)], shards=1)
    ro = sharded_side("rollout", [("W", (8, 4), 0)], shards=2)  # rank 0: rows 0:4, rank 1: rows 4:8
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="off")
    assert validate_plan(plan, tr, ro) == []
    (rnd,) = plan.rounds
    assert [(b.sender, b.receiver) for b in rnd.buckets] == [(0, 0), (0, 1)]
    return tr, ro, plan, rnd.buckets


def _with(plan: TransferPlan, *buckets: Bucket) -> TransferPlan:
    return dataclasses.replace(plan, rounds=(Round(0, tuple(buckets)),))


def _problems(plan, tr, ro, **kw) -> list[tuple[str, str]]:
    return [(p.kind, p.message) for p in validate_plan(plan, tr, ro, **kw)]


def test_unknown_sender_rank():
    tr, ro, plan, (b0, b1) = _valid()
    got = _problems(_with(plan, b0, b1, b0._replace(sender=7)), tr, ro)
    assert got == [("unknown", "round 0 trainer 7 -> rollout 0: no such sender")]


def test_unknown_receiver_rank():
    tr, ro, plan, (b0, b1) = _valid()
    got = _problems(_with(plan, b0, b1, b0._replace(receiver=9)), tr, ro)
    assert got == [("unknown", "round 0 trainer 0 -> rollout 9: no such receiver")]


def test_unknown_local_tensor():
    tr, ro, plan, (b0, b1) = _valid()
    bad = b0._replace(items=(b0.items[0]._replace(src_tensor="nope"),))
    got = _problems(_with(plan, bad, b1), tr, ro)
    assert [k for k, _ in got] == ["unknown"] and "sender tensor does not exist" in got[0][1]


def test_unknown_canonical_tensor():
    tr, ro, plan, _ = _valid()
    model = CanonicalModel((CanonicalTensor("V", (8, 4), "bfloat16"),))
    got = _problems(plan, tr, ro, canonical=model)
    assert [k for k, _ in got] == ["unknown", "unknown"] and all("canonical tensor W not in the model" in m
                                                                for _, m in got)


def test_item_bytes():
    tr, ro, plan, (b0, b1) = _valid()
    it = b0.items[0]
    bad = b0._replace(items=(it._replace(nbytes=it.nbytes + 2),), nbytes=b0.nbytes + 2)
    got = _problems(_with(plan, bad, b1), tr, ro)
    assert [k for k, _ in got] == ["bytes"] and f"item says {it.nbytes + 2} bytes" in got[0][1]


def test_bucket_bytes():
    tr, ro, plan, (b0, b1) = _valid()
    got = _problems(_with(plan, b0._replace(nbytes=b0.nbytes + 2), b1), tr, ro)
    assert [k for k, _ in got] == ["bytes"] and f"bucket says {b0.nbytes + 2} bytes" in got[0][1]


def test_outside_box_of_a_held_tensor():
    # rank 0 holds W rows 0:4; it is also sent rows 4:8 (which no piece of it holds, hence also "mapping")
    tr, ro, plan, (b0, b1) = _valid()
    it = b0.items[0]
    extra = it._replace(canonical_box=((4, 8), (0, 4)), src_box=((4, 8), (0, 4)))
    bad = b0._replace(items=(it, extra), nbytes=b0.nbytes + extra.nbytes)
    got = _problems(_with(plan, bad, b1), tr, ro)
    assert sorted({k for k, _ in got}) == ["mapping", "outside"]
    assert ("outside", "rollout 0 receives W[4:8, 0:4] it does not need") in got


def test_outside_tensor_the_receiver_holds_no_piece_of():
    tr, ro, plan, (b0, b1) = _valid()
    it = b0.items[0]
    extra = it._replace(canonical="X")
    bad = b0._replace(items=(it, extra), nbytes=b0.nbytes + extra.nbytes)
    got = _problems(_with(plan, bad, b1), tr, ro)
    assert sorted({k for k, _ in got}) == ["mapping", "outside"]
    assert ("outside", "rollout 0 receives X (1 boxes) but holds no piece of it") in got


def test_order_forward_before_arrival():
    tr = sharded_side("trainer", [("W", (32, 8), None)], shards=1)
    ro = sharded_side("rollout", [("W", (32, 8), 0)], shards=2, instances=2)
    plan = build_plan(tr, ro, round_bytes=MiB, receiver_dedup="on")
    assert validate_plan(plan, tr, ro) == [] and plan.exchange_bytes and plan.num_rounds >= 2
    squashed = dataclasses.replace(plan, rounds=(Round(0, tuple(b for r in plan.rounds for b in r.buckets)),))
    got = _problems(squashed, tr, ro)
    assert got and {k for k, _ in got} == {"order"}
    assert all("before receiving all of it" in m for _, m in got)
