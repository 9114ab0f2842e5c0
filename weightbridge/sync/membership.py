"""Per-epoch helpers: the plan of an epoch's roster, dtype digests, tensor checks (pure except torch dtypes).

An epoch's rollout side is a subset of the spec's instances (late joiners, restarts, instances
that left); its :class:`~weightbridge.sync.roster.Roster` renumbers it for the plan
(:meth:`~weightbridge.sync.roster.Roster.rollout_layout`) and :class:`PlanCache` keeps this rank's slice
of the plan per instance set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weightbridge.layout.ir import RankLayout, SideLayout
from weightbridge.plan import build_rank_plan
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.types import ROLLOUT, RankPlan, TransferPlan
from weightbridge.sync.auth import Signer, data_token
from weightbridge.sync.roster import RankId, Roster


class PlanCache:
    """This rank's slice of the plan per rollout instance set, built on first use.

    Each rank plans only the buckets it sends or receives (:func:`weightbridge.plan.build_rank_plan`);
    ranks agree when the slices' ``plan_hash`` (the hash of the planner version and its inputs:
    layouts in the roster's numbering, ``round_bytes``, ``receiver_dedup``, the network model) is equal.
    """

    def __init__(self, trainer: SideLayout, rollout: SideLayout, *, round_bytes: int, receiver_dedup: str,
                 network: NetworkModel | None = None) -> None:
        self.trainer = trainer
        self.rollout = rollout
        self.round_bytes = round_bytes
        self.receiver_dedup = receiver_dedup
        self.network = network
        self._plans: dict[tuple, RankPlan] = {}

    def plan(self, roster: Roster, side: str, rank: int) -> RankPlan:
        """The slice of plan rank ``rank`` of ``side`` in the plan of ``roster``'s instances."""
        key = (roster.instances, side, rank)
        if key not in self._plans:
            self._plans[key] = build_rank_plan(
                self.trainer,
                roster.rollout_layout(self.rollout),
                side=side,
                rank=rank,
                round_bytes=self.round_bytes,
                network=self.network,
                receiver_dedup=self.receiver_dedup,  # type: ignore[arg-type]
            )
        return self._plans[key]


def plan_peers(plan: TransferPlan | RankPlan, side: str, rank: int) -> list[tuple[str, int]]:
    """The (side, plan rank) pairs that plan rank ``rank`` of ``side`` exchanges buckets with, sorted."""
    peers: set[tuple[str, int]] = set()
    for rnd in plan.rounds:
        for b in rnd.buckets:
            if b.src_side == side and b.sender == rank:
                peers.add((ROLLOUT, b.receiver))
            if side == ROLLOUT and b.receiver == rank:
                peers.add((b.src_side, b.sender))
    peers.discard((side, rank))
    return sorted(peers)


def data_check(
    plan: TransferPlan | RankPlan, roster: Roster, me: RankId, hellos: Mapping[RankId, Any], signer: Signer,
) -> tuple[list[int], Callable[[int, int], bytes]]:
    """The data-sender check of ``me`` in ``roster``'s epoch: the bridge ranks its plan exchanges data
    with, and ``token(src, dst)`` (bridge ranks) bound to the epoch, both spec ranks and their hello
    nonces (:func:`weightbridge.sync.auth.data_token`; run by :mod:`weightbridge.transport.peerauth`)."""
    peers = [roster.bridge_of_plan(s, r) for s, r in plan_peers(plan, me.side, roster.plan_rank(me))]

    def token(src: int, dst: int) -> bytes:
        a, b = roster.spec_of_bridge(src), roster.spec_of_bridge(dst)
        return data_token(signer, roster.epoch, a.key, hellos[a].nonce, b.key, hellos[b].nonce)

    return peers, token


def _digest(pairs: Sequence[tuple[str, str]]) -> str:
    text = "\n".join(f"{n}:{d}" for n, d in sorted(pairs))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def expected_dtypes(layout: RankLayout) -> str:
    """Digest of the dtypes the spec says ``layout``'s rank holds."""
    return _digest([(t.name, t.dtype) for t in layout.tensors])


def actual_dtypes(layout: RankLayout, tensors: Mapping[str, Any], max_diffs: int = 4) -> tuple[str, tuple[str, ...]]:
    """Digest of the real dtypes of ``layout``'s tensors in ``tensors``, and the first differences."""
    from weightbridge.tensors import dtype_name  # the tensors are torch's: torch is loaded

    pairs, diffs = [], []
    for t in layout.tensors:
        got = dtype_name(tensors[t.name].dtype)
        pairs.append((t.name, got))
        if got != t.dtype:
            diffs.append(f"{t.name}: spec {t.dtype}, tensor {got}")
    more = len(diffs) - max_diffs
    shown = diffs[:max_diffs] + ([f"and {more} more"] if more > 0 else [])
    return _digest(pairs), tuple(shown)


def check_tensors(layout: RankLayout, tensors: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` listing missing tensors and shape mismatches (dtypes go through the handshake)."""
    problems = []
    for t in layout.tensors:
        if t.name not in tensors:
            problems.append(f"missing tensor {t.name} {list(t.shape)}")
        elif tuple(tensors[t.name].shape) != tuple(t.shape):
            problems.append(f"{t.name}: spec shape {list(t.shape)}, tensor {list(tensors[t.name].shape)}")
    if problems:
        head = f"{layout.side} rank {layout.rank}: {len(problems)} tensor problem(s): "
        raise ValueError(head + "; ".join(problems[:6]) + (" ..." if len(problems) > 6 else ""))
