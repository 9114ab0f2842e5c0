"""The network description the cost model prices plans with, and its spec section.

A spec may carry an optional top-level ``network:`` section::

    network: h200                 # a preset name, or
    network:
      preset: h100                # start from a preset (default h100) ...
      nic_gbit_per_s: 200         # ... and override fields
      ranks_per_node: 4

Numbers are nominal link rates; see ``docs/planner.md`` for their sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True, kw_only=True)
class NetworkModel:
    """Per-GPU link rates in bytes/s; a rank is placed on node ``rank // ranks_per_node`` of its side.

    With ``colocated`` trainer rank ``i`` and rollout rank ``i`` share GPU ``i`` (and its NIC);
    otherwise the two sides are on disjoint nodes.
    """

    name: str = "h100"
    nic_bytes_per_s: float = 50e9  # 400 Gb/s NIC per GPU
    intra_node_bytes_per_s: float = 450e9  # NVLink 4, one direction per GPU
    ranks_per_node: int = 8
    message_latency_s: float = 20e-6  # per bucket, per rank, per round
    hbm_bytes_per_s: float = 3.35e12  # local copies (snapshot / swap in async mode)
    colocated: bool = False

    def with_colocated(self, colocated: bool) -> NetworkModel:
        return replace(self, colocated=colocated)


PRESETS: dict[str, NetworkModel] = {
    "h100": NetworkModel(name="h100"),
    "h200": NetworkModel(name="h200", hbm_bytes_per_s=4.8e12),
    "cpu-gloo": NetworkModel(
        name="cpu-gloo",
        nic_bytes_per_s=25e9 / 8,  # 25 Gb/s Ethernet
        intra_node_bytes_per_s=10e9,  # loopback TCP / shared memory, rough
        ranks_per_node=8,
        message_latency_s=100e-6,
        hbm_bytes_per_s=20e9,  # DRAM memcpy, one core
    ),
}

PresetName = Literal["h100", "h200", "cpu-gloo"]


class NetworkSpec(BaseModel):
    """The spec's optional ``network:`` section: a preset plus optional overrides."""

    model_config = ConfigDict(extra="forbid")

    preset: PresetName = Field(
        "h100", description="Starting point: h100, h200 (8 GPUs, NVLink, 400 Gb/s per GPU) or cpu-gloo."
    )
    nic_gbit_per_s: float | None = Field(None, gt=0, description="Per-GPU NIC bandwidth, Gbit/s.")
    intra_node_gbyte_per_s: float | None = Field(None, gt=0, description="Per-GPU intra-node bandwidth, GB/s one way.")
    ranks_per_node: int | None = Field(None, ge=1, description="GPUs (ranks) per node.")
    message_latency_us: float | None = Field(None, ge=0, description="Per-message latency, microseconds.")
    hbm_gbyte_per_s: float | None = Field(None, gt=0, description="Device memory copy bandwidth, GB/s.")

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
        return replace(m, **kw)


def network_model(value: Any = None, *, colocated: bool = False) -> NetworkModel:
    """``NetworkModel`` from a spec's ``network`` value (None, preset name, mapping or NetworkSpec)."""
    if isinstance(value, NetworkModel):
        return value.with_colocated(colocated)
    return NetworkSpec.parse(value).to_model(colocated=colocated)
