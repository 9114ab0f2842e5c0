"""Draft a spec from a short description: which model, which framework and mesh on each side.

:func:`draft_spec` only writes text (plus the list of what it assumed); checking it is
:func:`weightbridge.spec.resolve.check_text`'s job, exactly as for a hand-written spec.
Used by the MCP server's ``generate_spec`` tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from weightbridge.layout.presets import load_preset

TRAINER_PRESETS = ("megatron", "fsdp2", "hf")
ROLLOUT_PRESETS = ("vllm", "sglang", "hf")
SYNC_MODES = ("sync", "async", "colocated")
DEFAULT_ROUND_BYTES = "1GiB"
DEFAULT_NETWORK = "h100"
TRANSPORTS = ("auto", "nccl", "gloo")
# The network preset of the planner's cost model that matches a transport (weightbridge.plan.network).
NETWORK_FOR_TRANSPORT = {"auto": DEFAULT_NETWORK, "nccl": DEFAULT_NETWORK, "gloo": "cpu-gloo"}

_MODE_NOTE = {
    "sync": "the trainer waits until every rollout rank applied each update",
    "async": "rollout keeps serving the previous weights while the next update is staged",
    "colocated": "trainer and rollout tensors in one process; updates are direct tensor copies (no wire)",
}


# Mesh axes whose default is not 1 (weightbridge.layout.mesh derives them as the framework does).
_DERIVED_AXES = {
    ("megatron", "etp"): "tp (Megatron's default expert_tensor_parallel_size; give etp: 1 to keep experts whole "
                         "per EP rank)",
}


def framework_notes(trainer_preset: str, rollout_preset: str, *, moe: bool) -> list[str]:
    """What a preset assumes about the framework's memory layout that a live system may contradict,
    each with how to change it. ``moe``: the model has experts (the expert notes are stated only then)."""
    notes = []
    if trainer_preset == "megatron":
        notes.append("trainer.params.local_spec: false (Transformer Engine layer spec: layer norms fused into "
                     "linear_qkv.layer_norm_weight / linear_fc1.layer_norm_weight; Megatron's local spec, "
                     "get_gpt_layer_local_spec, keeps input_layernorm / pre_mlp_layernorm: set local_spec: true)")
        if moe:
            notes.append("trainer.params.moe_grouped_gemm: true (TEGroupedMLP experts linear_fc1.weight{i}; "
                         "SequentialMLP experts.local_experts.{i}: set moe_grouped_gemm: false)")
    if trainer_preset == "fsdp2" and moe:
        notes.append("trainer.params.fused_experts: true (transformers >= 5 keeps each layer's experts fused in "
                     "memory, mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj, sharded over dp by "
                     "FSDP2; transformers < 5 holds one tensor per expert under checkpoint names: set "
                     "fused_experts: false)")
    if rollout_preset == "sglang":
        notes.append("rollout.params.cpu_pad: false (SGLang's GPU layout. SGLang on CPU pads dense and MoE "
                     "intermediate sizes to a multiple of tp * 32, a rank may hold only padding: set cpu_pad: true, "
                     "whose rules use pad: {dim: 0, multiple: \"tp * 32\"} (pad.multiple takes expressions); it "
                     "also pads KV heads to a multiple of tp, which no param describes: choose tp dividing them)")
    if rollout_preset in ("vllm", "sglang"):
        notes.append(f"rollout.params.vocab_multiple: 64 (the {rollout_preset} vocabulary padding before the tp split)")
    notes.append("layouts: from the presets, not from your processes; `weightbridge probe --check` (or the "
                 "conformance suite's probe-agrees requirements) compares them with the live loaders, and pins: "
                 "records what was checked")
    return notes


@dataclass(frozen=True)
class Draft:
    """A drafted spec: YAML ``text`` and one line per default it filled in."""

    text: str
    assumptions: list[str] = field(default_factory=list)


def _side(name: str, preset: str, mesh: Mapping[str, int], instances: int | None, notes: list[str]) -> dict[str, Any]:
    family = load_preset(preset).family
    axes = list(family.user_axes) + [a for a, _ in family.defaults]
    unset = [a for a in axes if a not in mesh]
    derived = [a for a in unset if (preset, a) in _DERIVED_AXES]
    ones = [a for a in unset if a not in derived]
    if ones:
        notes.append(f"{name}.mesh: {', '.join(ones)} not given, so 1 (axes of the {preset} preset: {', '.join(axes)})")
    notes.extend(f"{name}.mesh.{a}: not given, so {_DERIVED_AXES[preset, a]}" for a in derived)
    out: dict[str, Any] = {"preset": preset}
    if name == "rollout":
        if instances is None:
            notes.append("rollout.instances: 1 (one engine; set instances for several identical engines)")
        out["instances"] = instances or 1
    out["mesh"] = {a: int(v) for a, v in mesh.items()} or {axes[0]: 1}
    return out


def draft_spec(
    model: Mapping[str, Any],
    *,
    trainer_preset: str,
    trainer_mesh: Mapping[str, int],
    rollout_preset: str,
    rollout_mesh: Mapping[str, int],
    rollout_instances: int | None = None,
    mode: str | None = None,
    max_staleness: int | None = None,
    round_bytes: int | str | None = None,
    network: str | None = None,
    transport: str | None = None,
) -> Draft:
    """A version-1 spec for this description; every default used is listed in ``assumptions``.

    ``model`` is a spec ``model:`` mapping (``{"bundled": NAME}``, ``{"config": PATH}``, ...);
    a path in it is written as given (the caller makes it relative to the spec file's directory).
    ``transport`` (``sync.transport``: auto, nccl, gloo) also picks the default ``network``:
    ``cpu-gloo`` for gloo, else ``h100``.
    Mesh axes are not checked here: :func:`~weightbridge.spec.resolve.check_text` reports an
    unknown or non-dividing axis at its JSON path (``$.trainer.mesh.tp``).
    """
    notes: list[str] = []
    spec: dict[str, Any] = {"version": 1, "model": dict(model)}
    spec["trainer"] = _side("trainer", trainer_preset, trainer_mesh, None, notes)
    spec["rollout"] = _side("rollout", rollout_preset, rollout_mesh, rollout_instances, notes)
    if mode is None:
        notes.append(f"sync.mode: sync ({_MODE_NOTE['sync']})")
    sync: dict[str, Any] = {"mode": mode or "sync"}
    if sync["mode"] == "async":
        if max_staleness is None:
            notes.append("sync.max_staleness: 1 (the trainer may run one version ahead of rollout)")
        sync["max_staleness"] = 1 if max_staleness is None else max_staleness
    if round_bytes is None:
        notes.append(f"sync.round_bytes: {DEFAULT_ROUND_BYTES} (per-rank cap on wire buffers in one round)")
    sync["round_bytes"] = DEFAULT_ROUND_BYTES if round_bytes is None else round_bytes
    if transport is None:
        notes.append("sync.transport: auto (NCCL for CUDA tensors, else Gloo; give transport gloo for CPU, "
                     "which also makes network cpu-gloo)")
    else:
        sync["transport"] = transport
    spec["sync"] = sync
    default_network = NETWORK_FOR_TRANSPORT[transport or "auto"]
    if network is None:
        notes.append(f"network: {default_network} (cost model of plan_transfer / weightbridge plan only; "
                     f"the preset for transport {transport or 'auto'})")
    spec["network"] = network or default_network
    header = (
        f"# Drafted by weightbridge: {trainer_preset} -> {rollout_preset}, {sync['mode']} updates.\n"
        "# Check it with `weightbridge validate`; see `weightbridge docs spec` for overrides (rules:).\n"
    )
    return Draft(header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None), notes)
