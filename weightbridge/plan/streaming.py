"""What a streaming receiver holds: when each of its local tensors starts and ends (pure data).

A rollout rank that streams (``docs/memory.md``) keeps no copy of its shard: a local tensor exists
from the first round that writes it until nothing later in the plan writes or reads it (its last
received item, the local copies from and into it, the exchange sends that forward it), then goes to
the engine. :func:`stream_schedule` gives those positions for one rank (what
:mod:`weightbridge.transport.stream` runs by); :func:`stream_peak_bytes` the most bytes of local
tensors alive at once, which the executor reports as measured (``ExecStats.stream_peak_bytes``).

Positions index the rounds the rank takes part in (``(round index, sends, receives)`` in plan
order, as :class:`~weightbridge.transport.executor.Executor` lists them); -1 is "before the first".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from weightbridge.layout.box import box_numel
from weightbridge.plan.types import ROLLOUT, Bucket, LocalCopy, RankPlan, TransferPlan

MyRounds = Sequence[tuple[int, Sequence[Bucket], Sequence[Bucket]]]


class StreamSchedule(NamedTuple):
    """When each local tensor of a rank is complete, and when each local copy can run."""

    first: dict[str, int]  # tensor -> the position of the first round (or copy) that writes or reads it
    done: dict[int, tuple[str, ...]]  # position -> the tensors complete after it (first-touch order)
    copies: dict[int, tuple[LocalCopy, ...]]  # position -> the local copies to apply after it (plan order)
    order: tuple[str, ...]  # every tensor the rank's plan touches, in first-touch order


def rank_rounds(plan: TransferPlan | RankPlan, rank: int) -> list[tuple[int, list[Bucket], list[Bucket]]]:
    """``(round index, exchange sends, receives)`` of every round rollout rank ``rank`` takes part in."""
    out = []
    for rnd in plan.rounds:
        sends = [b for b in rnd.buckets if b.src_side == ROLLOUT and b.sender == rank]
        recvs = [b for b in rnd.buckets if b.receiver == rank]
        if sends or recvs:
            out.append((rnd.index, sends, recvs))
    return out


def stream_schedule(my_rounds: MyRounds, local_copies: Sequence[LocalCopy]) -> StreamSchedule:
    """The :class:`StreamSchedule` of one rank's rounds and local copies."""
    first: dict[str, int] = {}
    last_write: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for pos, (_, sends, recvs) in enumerate(my_rounds):
        for b in recvs:
            for it in b.items:
                last_write[it.dst_tensor] = pos
                first.setdefault(it.dst_tensor, pos)
        for b in sends:  # exchange sends read what earlier rounds received
            for it in b.items:
                last_read[it.src_tensor] = pos
    copies: dict[int, list[LocalCopy]] = {}
    for c in local_copies:  # once the source holds what it receives (and what earlier copies put there)
        at = last_write.get(c.src_tensor, -1)
        copies.setdefault(at, []).append(c)
        last_read[c.src_tensor] = max(last_read.get(c.src_tensor, -1), at)
        last_write[c.dst_tensor] = max(last_write.get(c.dst_tensor, -1), at)
        first[c.src_tensor] = min(first.get(c.src_tensor, at), at)
        first[c.dst_tensor] = min(first.get(c.dst_tensor, at), at)
    order = tuple(sorted(first, key=lambda n: first[n]))  # stable: ties keep first-touch order
    done: dict[int, list[str]] = {}
    for n in order:
        done.setdefault(max(last_write.get(n, -1), last_read.get(n, -1)), []).append(n)
    return StreamSchedule(first, {k: tuple(v) for k, v in done.items()}, {k: tuple(v) for k, v in copies.items()},
                          order)


def covered_tensors(my_rounds: MyRounds, local_copies: Sequence[LocalCopy], numel: Mapping[str, int]) -> set[str]:
    """The local tensors (``numel``: name -> element count) whose every element a received item or a local
    copy writes (the plan writes each destination element at most once: ``validate_plan``'s duplicate check)."""
    count: dict[str, int] = {}
    for _, _, recvs in my_rounds:
        for b in recvs:
            for it in b.items:
                count[it.dst_tensor] = count.get(it.dst_tensor, 0) + box_numel(it.dst_box)
    for c in local_copies:
        count[c.dst_tensor] = count.get(c.dst_tensor, 0) + box_numel(c.dst_box)
    return {n for n, k in count.items() if n in numel and k >= numel[n]}


def stream_peak_bytes(sched: StreamSchedule, nbytes: Mapping[str, int], positions: int) -> int:
    """The most bytes of local tensors (``nbytes``: name -> bytes) a streaming rank holds at once."""
    last = {n: pos for pos, names in sched.done.items() for n in names}
    delta = [0] * (positions + 2)  # alive over [first, last] (position -1 shifted to index 0)
    for n, f in sched.first.items():
        delta[f + 1] += nbytes.get(n, 0)
        delta[last[n] + 2] -= nbytes.get(n, 0)
    peak = alive = 0
    for d in delta:
        alive += d
        peak = max(peak, alive)
    # tensors no round or copy touches (all padding on this rank) go over as zeros, one at a time, at the end
    return max([peak, *(b for n, b in nbytes.items() if n not in sched.first)])


def plan_stream_peaks(plan: TransferPlan, nbytes: Sequence[Mapping[str, int]]) -> list[int]:
    """:func:`stream_peak_bytes` of every rollout rank of ``plan`` (``nbytes[r]``: rank r's tensor bytes)."""
    copies: dict[int, list[LocalCopy]] = {}
    for c in plan.local_copies:
        copies.setdefault(c.rank, []).append(c)
    mine: dict[int, list[tuple[int, list[Bucket], list[Bucket]]]] = {}  # rank_rounds of every rank, one pass
    for rnd in plan.rounds:
        touched: dict[int, tuple[int, list[Bucket], list[Bucket]]] = {}
        for b in rnd.buckets:
            touched.setdefault(b.receiver, (rnd.index, [], []))[2].append(b)
            if b.src_side == ROLLOUT:
                touched.setdefault(b.sender, (rnd.index, [], []))[1].append(b)
        for r, entry in touched.items():
            mine.setdefault(r, []).append(entry)
    out = []
    for r, sizes in enumerate(nbytes):
        rounds = mine.get(r, [])
        out.append(stream_peak_bytes(stream_schedule(rounds, copies.get(r, [])), sizes, len(rounds)))
    return out


__all__ = ["StreamSchedule", "covered_tensors", "plan_stream_peaks", "rank_rounds", "stream_peak_bytes",
           "stream_schedule"]
