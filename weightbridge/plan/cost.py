"""Cost model: predicted time, lower bound, the gather-then-broadcast baseline, GPU stall.

Formulas (documented with their assumptions in ``docs/planner.md``):

* A GPU has one NIC (``nic_bytes_per_s`` each way; with ``nics_per_node`` the GPUs of a node
  share that many) and one intra-node link (``intra_node_bytes_per_s`` each way). A transfer
  between GPUs on the same node uses the intra-node link of both, otherwise both NICs.
  Colocated: trainer rank i and rollout rank i are GPU i; a transfer within one GPU is priced
  like intra-node. Shared nodes: the two sides have GPUs of their own on the same nodes (node
  ``rank // ranks_per_node`` on both sides); otherwise the sides are on disjoint nodes and every
  trainer -> rollout transfer crosses NICs. ``hosts`` places every rank explicitly
  (:meth:`NetworkModel.node_of`, the one placement function).
* ``time(round) = max over GPUs, directions, links of bytes / bandwidth (and, with
  node_bytes_per_s, over nodes of their intra-node bytes / node_bytes_per_s)
  + message_latency_s * max over GPUs of buckets sent or received``.
* ``predicted = sum over rounds of time(round)`` (rounds are double-buffered, so packing of
  round r+1 hides behind the wire time of round r and is not counted).
* ``lower_bound = max over GPUs, directions, links of total bytes / bandwidth`` (this plan's
  bytes, no latency): no schedule of these bytes can be faster.
* Shared memory (``local_copy``, from ``sync.transport``: the colocated data plane): a pair that shares
  memory (:meth:`NetworkModel.local`) uses no link; its bytes are copied once into the sender's slab and
  once out of it, each at ``hbm_bytes_per_s`` on the GPU (or CPU) that copies, and a round takes at least
  ``max over GPUs of copied bytes / hbm_bytes_per_s``.
* With deltas (``sync.delta``) and an expected change rate ``f`` (:func:`price_delta`): each bucket
  of ``E`` elements costs ``min(full, positions + values)`` wire bytes plus its header, positions the
  smaller of a bitmap (``E / 8``) and Elias-Fano (``k (2 + log2(E / k)) / 8``, ``k = f E``), values
  one byte per changed 2-byte element (a difference code) and the raw bytes for other sizes; a
  message larger than the first piece costs a second message latency; and a round takes at least
  its busiest rank's codec time, ``3 x bytes it sends / hbm_bytes_per_s`` (compare against the
  previous copy, update it), overlapped with the wire like packing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from weightbridge.layout.box import box_numel
from weightbridge.layout.ir import SideLayout, dtype_bytes
from weightbridge.plan.instances import group_instances
from weightbridge.plan.network import NetworkModel
from weightbridge.plan.types import ROLLOUT, TRAINER, TransferPlan

class Links:
    """Bytes per NIC (out, in), per GPU on the intra-node link (out, in), per node intra-node
    bytes (for ``node_bytes_per_s``) and message counts per GPU.

    The one implementation of the link model: the receiver de-replication estimate
    (:mod:`weightbridge.plan.decide`) and :func:`price` (a plan, round by round) both add to it.
    """

    def __init__(self, net: NetworkModel, placement: dict | None = None):
        self.net = net
        self.nic_out: dict = {}
        self.nic_in: dict = {}
        self.nv_out: dict = {}
        self.nv_in: dict = {}
        self.msgs: dict = {}
        self.node_tot: dict = {}  # node -> intra-node bytes (net.node_bytes_per_s)
        self.mem: dict = {}  # GPU -> bytes it copies through shared memory (net.local_copy), at hbm_bytes_per_s
        self.placement: dict = {} if placement is None else placement  # (side, rank) -> (gpu, node, nic), cached

    def _at(self, side: str, rank: int) -> tuple:
        w = self.placement.get((side, rank))
        if w is None:
            net = self.net
            w = self.placement[(side, rank)] = (net.gpu_of(side, rank), net.node_of(side, rank), net.nic_of(side, rank))
        return w

    def add(self, src_side: str, s: int, dst_side: str, r: int, nbytes: float, messages: int = 1) -> None:
        gs, ns, cs = self._at(src_side, s)
        gr, nr, cr = self._at(dst_side, r)
        if self.net.local_copy != "off" and self.net.local((gs, ns), (gr, nr)):
            self.mem[gs] = self.mem.get(gs, 0) + nbytes  # the sender's copy into its slab
            self.mem[gr] = self.mem.get(gr, 0) + nbytes  # the receiver's copy out of it
        elif ns == nr:
            self.nv_out[gs] = self.nv_out.get(gs, 0) + nbytes
            self.nv_in[gr] = self.nv_in.get(gr, 0) + nbytes
            self.node_tot[ns] = self.node_tot.get(ns, 0) + nbytes
        else:
            self.nic_out[cs] = self.nic_out.get(cs, 0) + nbytes
            self.nic_in[cr] = self.nic_in.get(cr, 0) + nbytes
        self.msgs[gs] = self.msgs.get(gs, 0) + messages
        self.msgs[gr] = self.msgs.get(gr, 0) + messages

    def add_all_to_all(self, side: str, ranks: Sequence[int], nbytes: float) -> None:
        """:meth:`add` of ``nbytes`` (one message) from every rank of ``ranks`` to every other,
        in O(len(ranks)) instead of one call per ordered pair."""
        where = [self._at(side, r) for r in ranks]
        per_node: dict = {}
        for _, n, _ in where:
            per_node[n] = per_node.get(n, 0) + 1
        peers = len(ranks) - 1
        if peers < 1:
            return
        shared = self.net.local_copy == "host"  # same-node pairs move through shared memory
        for g, n, c in where:
            same = per_node[n] - 1
            if same and shared:
                self.mem[g] = self.mem.get(g, 0) + 2 * nbytes * same  # copies out of and into its memory
            elif same:
                b = nbytes * same
                self.nv_out[g] = self.nv_out.get(g, 0) + b
                self.nv_in[g] = self.nv_in.get(g, 0) + b
                self.node_tot[n] = self.node_tot.get(n, 0) + b
            if peers - same:
                b = nbytes * (peers - same)
                self.nic_out[c] = self.nic_out.get(c, 0) + b
                self.nic_in[c] = self.nic_in.get(c, 0) + b
            self.msgs[g] = self.msgs.get(g, 0) + 2 * peers

    def add_bytes_of(self, other: Links) -> None:
        """Add ``other``'s bytes (not its messages) to this one's."""
        for src, dst in ((other.nic_out, self.nic_out), (other.nic_in, self.nic_in), (other.nv_out, self.nv_out),
                         (other.nv_in, self.nv_in), (other.node_tot, self.node_tot), (other.mem, self.mem)):
            for k, v in src.items():
                dst[k] = dst.get(k, 0) + v

    def wire_seconds(self) -> float:
        """Seconds of the busiest link and direction: bytes / bandwidth."""
        net = self.net
        nic = max([0, *self.nic_out.values(), *self.nic_in.values()]) / net.nic_bytes_per_s
        nv = max([0, *self.nv_out.values(), *self.nv_in.values()]) / net.intra_node_bytes_per_s
        host = max([0, *self.node_tot.values()]) / net.node_bytes_per_s if net.node_bytes_per_s else 0.0
        mem = max([0, *self.mem.values()]) / net.hbm_bytes_per_s
        return max(nic, nv, host, mem)

    def latency_seconds(self) -> float:
        """Message latency times the most messages any GPU sends or receives."""
        return max([0, *self.msgs.values()]) * self.net.message_latency_s


# Wire constants of sync.delta (weightbridge.transport.delta, which imports torch; equal: tested).
DELTA_HEADER_BYTES = 64
DELTA_FIRST_BYTES = 4096
_DELTA_VALUE_BYTES = {1: 1.0, 2: 1.0, 4: 4.0, 8: 8.0}  # per changed element, by element size
DELTA_CODEC_PASSES = 3.0


def delta_bucket_bytes(items, change_rate: float) -> float:
    """Expected wire bytes of a bucket sent as a delta (header included, checksum not) when
    ``change_rate`` of its elements changed; never more than the full bucket plus its header."""
    full = sum(it.nbytes for it in items)
    elements, values = 0.0, 0.0
    for it in items:
        size = dtype_bytes(it.dtype)
        n = it.nbytes / size
        elements += n
        values += change_rate * n * _DELTA_VALUE_BYTES.get(size, size)
    k = change_rate * elements
    positions = 0.0 if k <= 0 else min(elements / 8, k * (2 + max(0.0, math.log2(elements / k))) / 8)
    return DELTA_HEADER_BYTES + min(full, positions + values)


def price_delta(plan: TransferPlan, net: NetworkModel, change_rate: float) -> tuple[float, float]:
    """``(predicted_seconds, wire_bytes)`` of ``plan`` sent with deltas at ``change_rate`` (module docstring)."""
    if not 0.0 <= change_rate <= 1.0:
        raise ValueError(f"change rate must be within [0, 1], got {change_rate}")
    placement: dict = {}
    predicted = wire = 0.0
    for r in plan.rounds:
        links = Links(net, placement)
        sent: dict[tuple[str, int], float] = {}
        for b in r.buckets:
            nbytes = delta_bucket_bytes(b.items, change_rate)
            msgs = 2 if nbytes > DELTA_FIRST_BYTES else 1
            links.add(b.src_side, b.sender, ROLLOUT, b.receiver, max(nbytes, min(b.nbytes, DELTA_FIRST_BYTES)), msgs)
            wire += nbytes
            key = (b.src_side, b.sender)
            sent[key] = sent.get(key, 0) + b.nbytes
        codec = DELTA_CODEC_PASSES * max(sent.values(), default=0) / net.hbm_bytes_per_s
        predicted += max(links.wire_seconds() + links.latency_seconds(), codec)
    return predicted, wire


def price(plan: TransferPlan, net: NetworkModel) -> tuple[float, float]:
    """``(predicted_seconds, lower_bound_seconds)`` of ``plan`` (formulas in the module docstring)."""
    total = Links(net)
    predicted = 0.0
    for r in plan.rounds:
        links = Links(net, total.placement)  # placement is the same in every round
        add = links.add
        for b in r.buckets:
            add(b.src_side, b.sender, ROLLOUT, b.receiver, b.nbytes)
        predicted += links.wire_seconds() + links.latency_seconds()
        total.add_bytes_of(links)
    return predicted, total.wire_seconds()


# ---------------------------------------------------------------------------
# Baseline: gather-then-broadcast (slime, OpenRLHF, verl default)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    gather_seconds: float
    broadcast_seconds: float
    model_bytes: int  # bytes every rollout rank receives (full tensors it needs any part of)

    @property
    def seconds(self) -> float:
        return self.gather_seconds + self.broadcast_seconds


def _stage_of(lay) -> int:
    for k, v in lay.coords:
        if k in ("pp", "pipeline", "stage"):
            return int(v)
    return 0


def baseline(trainer: SideLayout, rollout: SideLayout, net: NetworkModel) -> Baseline:
    """Price gather-then-broadcast with the same network model.

    Each PP stage gathers its full tensors on one leader rank (stages in parallel), then the
    leaders broadcast every tensor to every rollout rank (each rollout rank receives every
    tensor in full and slices its part). Element size: the rollout's local dtype.
    """
    # canonical name -> (numel, element size) of the full tensor, from the rollout side
    esize: dict[str, int] = {}
    for lay in (x for tpl in group_instances(rollout) for x in tpl.layouts):  # identical instances once
        for t in lay.tensors:
            for p in t.pieces:
                esize.setdefault(p.canonical, dtype_bytes(t.dtype))
    # full canonical extent seen by the trainer (union bounding box of its pieces)
    extent: dict[str, list[int]] = {}
    stage_names: dict[int, dict[str, None]] = {}
    leader: dict[int, int] = {}
    held: dict[int, dict[str, int]] = {}
    for lay in trainer.ranks:
        st = _stage_of(lay)
        leader.setdefault(st, lay.rank)
        names = stage_names.setdefault(st, {})
        for t in lay.tensors:
            for p in t.pieces:
                e = extent.get(p.canonical)
                hi = [b for _, b in p.canonical_box]
                if e is None:
                    extent[p.canonical] = hi
                else:
                    extent[p.canonical] = [max(x, y) for x, y in zip(e, hi)]
                names[p.canonical] = None
                if leader[st] == lay.rank:
                    h = held.setdefault(st, {})
                    h[p.canonical] = h.get(p.canonical, 0) + box_numel(p.canonical_box)

    def nbytes(name: str) -> int:
        n = 1
        for x in extent[name]:
            n *= x
        return n * esize[name]

    model_bytes = sum(nbytes(n) for n in extent if n in esize)
    gather = 0.0
    ranks_by_stage: dict[int, list[int]] = {}
    for lay in trainer.ranks:
        ranks_by_stage.setdefault(_stage_of(lay), []).append(lay.rank)
    for st, names in stage_names.items():
        stage_bytes = sum(nbytes(n) for n in names if n in esize)
        lead_has = sum(min(v, 1 << 62) * esize[n] for n, v in held.get(st, {}).items() if n in esize)
        rs = ranks_by_stage[st]
        one_node = len({net.node_of(TRAINER, r) for r in rs}) == 1
        bw = net.intra_node_bytes_per_s if one_node else net.nic_bytes_per_s
        gather = max(gather, max(0, stage_bytes - lead_has) / bw)
    one_node_all = len(
        {net.node_of(ROLLOUT, r.rank) for r in rollout.ranks} | {net.node_of(TRAINER, r) for r in leader.values()}) == 1
    bw = net.intra_node_bytes_per_s if one_node_all else net.nic_bytes_per_s
    ntensors = sum(1 for n in extent if n in esize)
    broadcast = model_bytes / bw + ntensors * net.message_latency_s
    return Baseline(gather, broadcast, model_bytes)


# ---------------------------------------------------------------------------
# Stall
# ---------------------------------------------------------------------------


def stall_seconds(
    *,
    mode: str,
    max_staleness: int,
    update_seconds: float,
    trainer_ranks: int,
    rollout_ranks: int,
    trainer_async_seconds: float,
    rollout_async_seconds: float,
) -> float:
    """Average seconds a GPU is idle because of one update.

    ``sync`` / ``colocated``: every GPU waits for the whole update. ``async``: the rollout waits
    only ``rollout_async_seconds`` (final apply/swap); the trainer waits
    ``trainer_async_seconds`` when ``max_staleness >= 1`` (the update finishes within the
    staleness bound), else the whole update.
    """
    if mode != "async":
        return update_seconds
    t = trainer_async_seconds if max_staleness >= 1 else update_seconds
    n = trainer_ranks + rollout_ranks
    return (trainer_ranks * t + rollout_ranks * rollout_async_seconds) / max(n, 1)
