"""Mesh families: how a framework numbers its ranks and which axes each rank sits on.

A family turns user mesh sizes (``{pp: 2, tp: 4, dp: 2}``) into, for every rank of
one instance, a coordinate per axis. Some axes are *views* of the same ranks
(Megatron's expert view ``etp, ep, edp`` over the dense ``tp, cp, dp``), so rules
can shard experts and dense tensors differently.

=========  ===========================================  =====================================
family     user axes (rank order, fastest first)         derived axes
=========  ===========================================  =====================================
megatron   tp, cp, dp, pp  (Megatron "tp-cp-ep-dp-pp")   expert view: etp, ep, edp per stage
fsdp2      tp, cp, dp, dp_replicate (DeviceMesh order     -
           [dp_replicate, dp, cp, tp], last fastest)
engine     tp, pp   (vLLM: rank = pp*tp + tp)             ep (1 or tp), etp = tp / ep
sglang     tp, pp   (as engine)                          ep (any divisor of tp), etp = tp / ep
hf         dp (identical replicas)                       -
custom     the spec's ``axes:`` in the order given          -
           (a side with ``preset: none``)
=========  ===========================================  =====================================

Pure; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class MeshProblem:
    axis: str  # the user axis at fault ("" for the mesh as a whole)
    message: str
    hint: str = ""


@dataclass(frozen=True)
class MeshFamily:
    name: str
    user_axes: tuple[str, ...]  # fastest-varying first
    defaults: tuple[tuple[str, int], ...] = ()

    def sizes(self, mesh: Mapping[str, int]) -> dict[str, int]:
        """All axis sizes, user and derived, with defaults filled in."""
        s = {a: 1 for a in self.user_axes}
        s.update(dict(self.defaults))
        s.update({k: int(v) for k, v in mesh.items()})
        if self.name == "megatron":
            if "etp" not in mesh:  # Megatron's default expert_tensor_parallel_size is tp
                s["etp"] = s["tp"]
            dense = s["tp"] * s["cp"] * s["dp"]
            s["edp"] = max(1, dense // max(1, s["etp"] * s["ep"]))
        elif self.name in ("engine", "sglang"):
            s["etp"] = s["tp"] // s["ep"] if s["ep"] and s["tp"] % s["ep"] == 0 else 1
        return s

    def world_size(self, mesh: Mapping[str, int]) -> int:
        s = self.sizes(mesh)
        n = 1
        for a in self.user_axes:
            n *= s[a]
        return n

    def check(self, mesh: Mapping[str, int]) -> list[MeshProblem]:
        """Problems with the mesh itself (unknown axes, impossible expert layouts)."""
        out = []
        allowed = set(self.user_axes) | {a for a, _ in self.defaults}
        for axis in mesh:
            if axis not in allowed:
                if self.name == CUSTOM:
                    declared = ", ".join(self.user_axes) or "none"
                    out.append(MeshProblem(axis, f"mesh axis {axis!r} is not among the declared axes ({declared})",
                                           "add it to the side's axes: (rank order, fastest first) or remove it"))
                else:
                    out.append(MeshProblem(axis, f"unknown mesh axis {axis!r} for a {self.name} layout",
                                           f"use {', '.join(sorted(allowed))}"))
        if out:
            return out
        s = self.sizes(mesh)
        if self.name == "megatron":
            dense = s["tp"] * s["cp"] * s["dp"]
            if dense % (s["etp"] * s["ep"]):
                out.append(
                    MeshProblem(
                        "ep",
                        f"etp*ep = {s['etp']}*{s['ep']} must divide tp*cp*dp = {dense} (ranks per pipeline stage)",
                        "raise dp or lower ep; set etp: 1 to keep experts whole",
                    )
                )
        if self.name == "engine" and s["ep"] not in (1, s["tp"]):
            out.append(
                MeshProblem("ep", f"ep = {s['ep']} must be 1 or equal tp = {s['tp']}", "vLLM expert parallelism spans the TP ranks of an instance")
            )
        if self.name == "sglang" and s["tp"] % s["ep"]:
            out.append(MeshProblem("ep", f"ep = {s['ep']} must divide tp = {s['tp']}", "SGLang splits each expert over tp / ep ranks"))
        return out

    def coords(self, mesh: Mapping[str, int], rank: int) -> dict[str, int]:
        """Coordinate of ``rank`` (within one instance) on every axis."""
        s = self.sizes(mesh)
        c: dict[str, int] = {}
        rest = rank
        for a in self.user_axes:
            c[a] = rest % s[a]
            rest //= s[a]
        if self.name == "megatron":
            in_stage = rank % (s["tp"] * s["cp"] * s["dp"])
            c["etp"] = in_stage % s["etp"]
            c["ep"] = (in_stage // s["etp"]) % s["ep"]
            c["edp"] = in_stage // (s["etp"] * s["ep"])
        elif self.name in ("engine", "sglang"):
            # moe_ep_rank = tp_rank // moe_tp, moe_tp_rank = tp_rank % moe_tp (moe_tp = tp / ep).
            c["ep"] = c["tp"] // s["etp"]
            c["etp"] = c["tp"] % s["etp"]
        return c


CUSTOM = "custom"


def custom_family(axes: tuple[str, ...] | list[str]) -> MeshFamily:
    """The mesh family of a side that declares its own ``axes`` (fastest-varying first):
    rank = c[a0] + s[a0] * (c[a1] + s[a1] * (c[a2] + ...)), no derived axes. An axis named ``pp``
    is the pipeline axis; ``ep`` owns ``{expert}`` by default, as in every family."""
    return MeshFamily(CUSTOM, tuple(axes))


FAMILIES: dict[str, MeshFamily] = {
    "megatron": MeshFamily("megatron", ("tp", "cp", "dp", "pp"), (("ep", 1), ("etp", 1))),
    "fsdp2": MeshFamily("fsdp2", ("tp", "cp", "dp", "dp_replicate")),
    "engine": MeshFamily("engine", ("tp", "pp"), (("ep", 1),)),
    "sglang": MeshFamily("sglang", ("tp", "pp"), (("ep", 1),)),
    "hf": MeshFamily("hf", ("dp",)),
}


def stage_layers(num_layers: int, pp: int, explicit: list[int] | None, style: str) -> list[range]:
    """Layers of each pipeline stage.

    ``explicit`` gives the count per stage. Otherwise ``style="even"`` requires
    ``pp`` to divide ``num_layers`` (Megatron), and ``style="vllm"`` spreads the
    remainder like vLLM's ``get_pp_indices`` (one extra layer per stage, starting
    from the second-to-last and moving towards the first).
    """
    if explicit is not None:
        counts = list(explicit)
    elif num_layers % pp == 0 or style != "vllm":
        counts = [num_layers // pp] * pp
    else:
        counts = [num_layers // pp] * pp
        for i in range(2, num_layers % pp + 2):
            counts[-i] += 1
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out
