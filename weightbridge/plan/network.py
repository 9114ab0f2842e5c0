"""The network description the cost model prices plans with, and its spec section.

A spec may carry an optional top-level ``network:`` section::

    network: h200                 # a preset name, or
    network:
      preset: h100                # start from a preset (default h100) ...
      nic_gbit_per_s: 200         # ... and override fields
      ranks_per_node: 4
    network:                      # or place every rank on a host: ranks in order, host by host
      preset: cpu-gloo
      nic_gbit_per_s: 1
      nics_per_node: 1            # one NIC per host, shared by its ranks
      hosts: [{trainer: 2, count: 2}, {rollout: 4, count: 2}]

Numbers are nominal link rates; see ``docs/planner.md`` for their sources.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


# Gloo over loopback on one 2-core host (bench/transfer_gloo.py, predicted / measured, docs/planner.md):
# one rank sends or receives at most ~3.6 GB/s, and all ranks of the host together ~4.6 GB/s.
CPU_GLOO_BYTES_PER_S = 3.6e9
CPU_GLOO_HOST_BYTES_PER_S = 4.6e9
CPU_GLOO_LATENCY_S = 100e-6


@dataclass(frozen=True, kw_only=True)
class NetworkModel:
    """Per-GPU link rates in bytes/s; a rank is placed on node ``rank // ranks_per_node`` of its side.

    With ``colocated`` trainer rank ``i`` and rollout rank ``i`` share GPU ``i`` (and its NIC);
    with ``shared_nodes`` the two sides have GPUs of their own on the same nodes (trainer rank ``s``
    and rollout rank ``r`` are on one node iff ``s // ranks_per_node == r // ranks_per_node``: a
    single host, or engines placed next to the trainer); otherwise the two sides are on disjoint nodes.

    ``hosts`` (when set) places every rank explicitly instead: host ``h`` holds the next
    ``hosts[h][0]`` trainer ranks and the next ``hosts[h][1]`` rollout ranks, in rank order (a host
    with both is shared by the two sides). ``nics_per_node`` (None: one NIC per GPU) is how many
    NICs a node has: the ranks of a node share them (its ``j``-th rank, trainer ranks first, uses
    NIC ``j % nics_per_node``), so ``1`` is one Ethernet port per host.
    """

    name: str = "h100"
    nic_bytes_per_s: float = 50e9  # 400 Gb/s NIC per GPU
    intra_node_bytes_per_s: float = 450e9  # NVLink 4, one direction per GPU
    ranks_per_node: int = 8
    message_latency_s: float = 20e-6  # per bucket, per rank, per round
    hbm_bytes_per_s: float = 3.35e12  # local copies (snapshot / swap in async mode)
    colocated: bool = False
    shared_nodes: bool = False
    # All intra-node bytes of one node together, per second (None: no such limit, each GPU's link
    # is its own, as with NVLink). On one CPU host every loopback byte costs CPU time of the same
    # few cores, so the host's total, not a rank's link, is what binds.
    node_bytes_per_s: float | None = None
    hosts: tuple[tuple[int, int], ...] | None = None  # per host: (trainer ranks, rollout ranks)
    nics_per_node: int | None = None  # None: a NIC per GPU
    # Which pairs move through shared memory (the colocated data plane, from sync.transport: local_copy_of):
    # "off" none, "gpu" a trainer and a rollout rank on one GPU, "host" any two ranks on one node. Their
    # bytes cost a copy in and a copy out at hbm_bytes_per_s, and the planner sends a receiver's boxes
    # from a holder next to it when one is.
    local_copy: str = "off"

    def with_colocated(self, colocated: bool) -> NetworkModel:
        return replace(self, colocated=colocated)

    def local(self, a: tuple[Hashable, Hashable], b: tuple[Hashable, Hashable]) -> bool:
        """Whether places ``a`` and ``b`` (each ``(gpu, node)``) exchange bytes through shared memory."""
        if self.local_copy == "host":
            return a[1] == b[1]
        return self.local_copy == "gpu" and a[0] == b[0]

    def nearness(self, side: str, rank: int, rollout_rank: int) -> int:
        """2: ``side``'s rank shares ``rollout_rank``'s GPU, 1: its node, 0: neither (the planner prefers
        the nearest holder of a box; only with ``local_copy``)."""
        if self.gpu_of(side, rank) == self.gpu_of("rollout", rollout_rank):
            return 2
        return 1 if self.node_of(side, rank) == self.node_of("rollout", rollout_rank) else 0

    # -- placement: the one place ranks are put on nodes and NICs ----------------------------
    def node_of(self, side: str, rank: int) -> Hashable:
        """The node (host) of ``side``'s rank ``rank``. With ``hosts`` a rank beyond them is on a
        node of its own (``check_hosts`` reports such a spec)."""
        if self.hosts is not None:
            ends = _host_ends(self.hosts, 0 if side == "trainer" else 1)
            h = bisect_right(ends, rank)
            return ("host", h) if h < len(ends) else (side, "beyond", rank)
        if self.colocated or self.shared_nodes:
            return ("node", rank // self.ranks_per_node)
        return (side, rank // self.ranks_per_node)

    def gpu_of(self, side: str, rank: int) -> Hashable:
        """The GPU of a rank: its own, or with ``colocated`` the one trainer and rollout rank ``i`` share."""
        return ("gpu", rank) if self.colocated else (side, rank)

    def nic_of(self, side: str, rank: int) -> Hashable:
        """The NIC a rank's inter-node bytes use (:attr:`nics_per_node`)."""
        if self.nics_per_node is None:
            return self.gpu_of(side, rank)
        node = self.node_of(side, rank)
        return (node, self._local_index(side, rank) % self.nics_per_node)

    def _local_index(self, side: str, rank: int) -> int:
        """The rank's index among its node's ranks, trainer ranks first."""
        if self.hosts is not None:
            h = bisect_right(_host_ends(self.hosts, 0 if side == "trainer" else 1), rank)
            if h >= len(self.hosts):
                return 0
            first_t = _host_ends(self.hosts, 0)[h] - self.hosts[h][0]
            first_r = _host_ends(self.hosts, 1)[h] - self.hosts[h][1]
            return rank - first_t if side == "trainer" else self.hosts[h][0] + rank - first_r
        if self.colocated:
            return rank % self.ranks_per_node
        local = rank % self.ranks_per_node
        return local + self.ranks_per_node if (self.shared_nodes and side != "trainer") else local

    def check_hosts(self, trainer_ranks: int, rollout_ranks: int) -> list[str]:
        """Problems of ``hosts`` for sides of these sizes (every rank placed, none beyond); [] when none."""
        if self.hosts is None:
            return []
        out = []
        for i, (side, n) in enumerate((("trainer", trainer_ranks), ("rollout", rollout_ranks))):
            placed = sum(h[i] for h in self.hosts)
            if placed != n:
                out.append(f"the hosts hold {placed} {side} rank(s), the {side} has {n}")
        return out


    def placement(self, trainer_ranks: int, rollout_ranks: int) -> dict[str, object]:
        """Where the cost model puts the ranks (``plan --json``'s ``placement``): ``sides`` is colocated,
        shared (the two sides' ranks on the same nodes) or disjoint; node counts per side; ``text`` says it."""
        n = self.ranks_per_node
        if self.hosts is not None:
            shared = sum(1 for t, r in self.hosts if t and r)
            text = (f"network.hosts: {len(self.hosts)} host(s), "
                    + ", ".join(f"host {h}: {t} trainer + {r} rollout" for h, (t, r) in enumerate(self.hosts))
                    + " (ranks in order, trainer and rollout numbered separately)")
            return {"sides": "shared" if shared else "disjoint", "ranks_per_node": n, "hosts": len(self.hosts),
                    "trainer_nodes": sum(1 for t, _ in self.hosts if t),
                    "rollout_nodes": sum(1 for _, r in self.hosts if r), "text": text}
        t_nodes, r_nodes = -(-trainer_ranks // n), -(-rollout_ranks // n)
        if self.colocated:
            sides, text = "colocated", (f"colocated: trainer rank i and rollout rank i share GPU i, {n} per node "
                                        f"({t_nodes} node(s))")
        elif self.shared_nodes:
            sides, text = "shared", (f"both sides on the same {max(t_nodes, r_nodes)} node(s), {n} ranks per node: "
                                     f"trainer rank s and rollout rank r share a node iff s // {n} == r // {n}")
        else:
            sides, text = "disjoint", (f"trainer ranks on {t_nodes} node(s), rollout ranks on {r_nodes} other "
                                       f"node(s), {n} ranks per node (rank r on node r // {n} of its side): every "
                                       "trainer -> rollout byte crosses the NICs")
        return {"sides": sides, "ranks_per_node": n, "trainer_nodes": t_nodes, "rollout_nodes": r_nodes, "text": text}

@lru_cache(maxsize=64)
def _host_ends(hosts: tuple[tuple[int, int], ...], i: int) -> tuple[int, ...]:
    """Cumulative rank counts of side ``i`` (0 trainer, 1 rollout) over ``hosts``: host ``h`` holds
    ranks ``[ends[h - 1], ends[h])``."""
    ends, n = [], 0
    for h in hosts:
        n += h[i]
        ends.append(n)
    return tuple(ends)


PRESETS: dict[str, NetworkModel] = {
    "h100": NetworkModel(name="h100"),
    "h200": NetworkModel(name="h200", hbm_bytes_per_s=4.8e12),
    # GB200 NVL72: one NVLink domain of 72 GPUs (NVLink 5, 1.8 TB/s bidirectional per GPU), 400 Gb/s
    # ConnectX-7 per GPU between racks, HBM3e.
    "gb200": NetworkModel(name="gb200", intra_node_bytes_per_s=900e9, ranks_per_node=72, hbm_bytes_per_s=8e12),
    # Gloo over loopback TCP on one host (CI and test machines): every rank on one node, both sides
    # sharing it. Calibrated with bench/transfer_gloo.py (docs/planner.md, "Presets").
    "cpu-gloo": NetworkModel(
        name="cpu-gloo",
        nic_bytes_per_s=25e9 / 8,  # 25 Gb/s Ethernet: only between hosts (ranks_per_node overridden)
        intra_node_bytes_per_s=CPU_GLOO_BYTES_PER_S,
        ranks_per_node=1024,
        message_latency_s=CPU_GLOO_LATENCY_S,
        hbm_bytes_per_s=20e9,  # DRAM memcpy, one core
        shared_nodes=True,
        node_bytes_per_s=CPU_GLOO_HOST_BYTES_PER_S,
    ),
}

PresetName = Literal["h100", "h200", "gb200", "cpu-gloo"]
MAX_HOSTS = 1 << 16


class HostSpec(BaseModel):
    """One host (or ``count`` alike) of ``network.hosts``: how many ranks of each side it holds."""

    model_config = ConfigDict(extra="forbid")

    trainer: int = Field(0, ge=0, le=1 << 20, description="Trainer ranks on this host (the next ones, in rank order).")
    rollout: int = Field(0, ge=0, le=1 << 20, description="Rollout ranks on this host (the next ones, in rank order).")
    count: int = Field(1, ge=1, le=1 << 16, description="This many hosts alike, one after another.")


class NetworkSpec(BaseModel):
    """The spec's optional ``network:`` section: a preset plus optional overrides."""

    model_config = ConfigDict(extra="forbid")

    preset: PresetName = Field(
        "h100", description="Starting point: h100, h200 (8 GPUs, NVLink, 400 Gb/s per GPU), gb200 (NVL72: "
        "72 GPUs per NVLink domain) or cpu-gloo (Gloo over loopback on one host)."
    )
    nic_gbit_per_s: float | None = Field(None, gt=0, description="Per-GPU NIC bandwidth, Gbit/s.")
    intra_node_gbyte_per_s: float | None = Field(None, gt=0, description="Per-GPU intra-node bandwidth, GB/s one way.")
    ranks_per_node: int | None = Field(None, ge=1, description="GPUs (ranks) per node.")
    message_latency_us: float | None = Field(None, ge=0, description="Per-message latency, microseconds.")
    hbm_gbyte_per_s: float | None = Field(None, gt=0, description="Device memory copy bandwidth, GB/s.")
    shared_nodes: bool | None = Field(
        None, description="Trainer and rollout ranks share nodes (rank // ranks_per_node on both sides): one host, "
        "or engines placed next to the trainer. Default: false (cpu-gloo: true).")
    node_gbyte_per_s: float | None = Field(
        None, gt=0, description="All intra-node traffic of one node together, GB/s (one CPU host's loopback). "
        "Default: no such limit (cpu-gloo: calibrated).")
    nics_per_node: int | None = Field(
        None, ge=1, le=1024, description="NICs per node, shared by its ranks (1: one port per host). "
        "Default: one NIC per GPU.")
    hosts: list[HostSpec] | None = Field(
        None, min_length=1, max_length=1 << 16, description="Every rank's host, host by host: each holds the next "
        "`trainer` trainer ranks and `rollout` rollout ranks (both: a shared host). Replaces ranks_per_node and "
        "shared_nodes; must place every rank of both sides.")

    @classmethod
    def parse(cls, value: Any) -> NetworkSpec:
        """Accept ``None``, a preset name or a mapping."""
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(preset=value)  # type: ignore[arg-type]
        if isinstance(value, NetworkSpec):
            return value
        return cls.model_validate(value)

    def to_model(self, *, colocated: bool = False) -> NetworkModel:
        m = PRESETS[self.preset]
        kw: dict[str, Any] = {"colocated": colocated}
        if self.nic_gbit_per_s is not None:
            kw["nic_bytes_per_s"] = self.nic_gbit_per_s * 1e9 / 8
        if self.intra_node_gbyte_per_s is not None:
            kw["intra_node_bytes_per_s"] = self.intra_node_gbyte_per_s * 1e9
        if self.ranks_per_node is not None:
            kw["ranks_per_node"] = self.ranks_per_node
        if self.message_latency_us is not None:
            kw["message_latency_s"] = self.message_latency_us * 1e-6
        if self.hbm_gbyte_per_s is not None:
            kw["hbm_bytes_per_s"] = self.hbm_gbyte_per_s * 1e9
        if self.shared_nodes is not None:
            kw["shared_nodes"] = self.shared_nodes
        if self.node_gbyte_per_s is not None:
            kw["node_bytes_per_s"] = self.node_gbyte_per_s * 1e9
        if self.nics_per_node is not None:
            kw["nics_per_node"] = self.nics_per_node
        if self.hosts is not None:
            if sum(h.count for h in self.hosts) > MAX_HOSTS:
                raise ValueError(f"hosts: more than {MAX_HOSTS} hosts")
            kw["hosts"] = tuple((h.trainer, h.rollout) for h in self.hosts for _ in range(h.count))
        return replace(m, **kw)

    def host_problems(self, trainer_ranks: int, rollout_ranks: int) -> list[str]:
        """What is wrong with ``hosts`` for sides of these sizes (too many hosts, ranks not all placed)."""
        if self.hosts is None:
            return []
        n = sum(h.count for h in self.hosts)
        if n > MAX_HOSTS:
            return [f"{n} hosts, more than {MAX_HOSTS}"]
        return self.to_model().check_hosts(trainer_ranks, rollout_ranks)


LOCAL_COPY = {"shm": "host", "ipc": "host", "auto": "gpu", "gloo": "off", "nccl": "off"}


def local_copy_of(transport: str) -> str:
    """The :attr:`NetworkModel.local_copy` of ``sync.transport``: ``shm`` / ``ipc`` move every pair on one
    host through shared memory; ``auto`` the pairs on one GPU (colocated; on CPU ``auto`` uses shared memory on
    one host too, which the plan prices as the wire); ``gloo`` / ``nccl`` none."""
    return LOCAL_COPY.get(transport, "off")


def network_model(value: Any = None, *, colocated: bool = False, local_copy: str = "off") -> NetworkModel:
    """``NetworkModel`` from a spec's ``network`` value (None, preset name, mapping or NetworkSpec)."""
    if local_copy not in ("off", "gpu", "host"):
        raise ValueError(f"local_copy must be off, gpu or host, got {local_copy!r}")
    if isinstance(value, NetworkModel):
        return replace(value, colocated=colocated, local_copy=local_copy)
    return replace(NetworkSpec.parse(value).to_model(colocated=colocated), local_copy=local_copy)
