"""The spec, version 1: pydantic models that generate the JSON Schema in ``spec/schema/``.

A spec says which model (canonical tensors), how the trainer and the rollout side
lay it out (preset + mesh + overrides), and how updates are synchronised. Field
docs here are what editors show; the schema is regenerated with
``weightbridge schema`` and checked with ``weightbridge schema --check``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema, model_validator

from weightbridge.layout.ir import DTYPE_ALIASES, DTYPE_BYTES, normalize_dtype
from weightbridge.layout.presets import PRESET_NAMES
from weightbridge.layout.rules import Rule
from weightbridge.plan.network import NetworkSpec, PresetName

SPEC_VERSION = 1
NO_PRESET = "none"  # a side described by its own rules and mesh axes

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
BYTES_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGTkmgt][iI]?[Bb]|[Bb])?\s*$"


def parse_bytes(value: Any) -> Any:
    """``"256MiB"`` -> 268435456; integers pass through; anything else is left for pydantic to reject."""
    if isinstance(value, str):
        m = _BYTES_RE.match(value)
        if m:
            return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    return value


def _check_dtype(value: Any) -> Any:
    if isinstance(value, str) and normalize_dtype(value) is not None:
        return normalize_dtype(value)
    raise ValueError(f"unknown dtype {value!r}")


ByteSize = Annotated[
    int,
    BeforeValidator(parse_bytes),
    Field(gt=0),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": BYTES_PATTERN}],
            "description": "Bytes: an integer or a size such as '256MiB', '1GB'.",
        }
    ),
]
DTYPE_NAMES = sorted(set(DTYPE_BYTES) | set(DTYPE_ALIASES))
DType = Annotated[str, BeforeValidator(_check_dtype), WithJsonSchema({"type": "string", "enum": DTYPE_NAMES})]
AxisName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", description="A mesh axis name (an identifier rules and expressions use).")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InlineTensor(_Strict):
    name: str
    shape: list[Annotated[int, Field(ge=0)]]
    dtype: DType = "bfloat16"


class ModelSource(_Strict):
    """Where the canonical tensors come from: exactly one of bundled / config / safetensors / tensors."""

    bundled: str | None = Field(default=None, description="A bundled config name (weightbridge models lists them).")
    config: str | None = Field(default=None, description="Path to a HF config.json (or its directory), relative to the spec.")
    safetensors: str | None = Field(default=None, description="Path to a .safetensors file, its index, or their directory.")
    tensors: list[InlineTensor] | None = Field(default=None, description="Inline canonical tensors.")
    dtype: DType | None = Field(default=None, description="Override the checkpoint dtype of floating tensors.")
    params: dict[str, int | bool | str] = Field(
        default_factory=dict, description="Model params for rule expressions (num_kv_heads, num_experts, ...), over derived ones."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("bundled", "config", "safetensors", "tensors") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of bundled / config / safetensors / tensors (got {given or 'none'})")
        return self


class PipelineSpec(_Strict):
    layers: list[Annotated[int, Field(ge=0)]] = Field(
        description="Layers per pipeline stage, first to last (uneven stages); must sum to the model's layers."
    )


class QuantizationSpec(_Strict):
    """The rollout serves some weights as FP8 E4M3 with scales (``weightbridge docs fp8``)."""

    format: Literal["fp8_e4m3"] = Field(default="fp8_e4m3", description="Weight format: FP8 E4M3 (float8_e4m3fn).")
    block: Annotated[list[Annotated[int, Field(ge=1, le=1 << 16)]], Field(min_length=2, max_length=2)] | Literal["row"] = Field(
        default_factory=lambda: [128, 128],
        description="One scale per [rows, cols] block (DeepSeek / vLLM fp8_per_block: [128, 128]), or row: one per "
        "output row (per channel).",
    )
    scales: Literal["float32", "ue8m0"] = Field(
        default="float32", description="Scale values: float32 (amax / 448) or ue8m0 (rounded up to a power of two).")
    scale_dtype: Literal["float32", "float8_e8m0fnu"] = Field(
        default="float32",
        description="How scales are stored: float32, or float8_e8m0fnu (UE8M0 packed: one exponent byte per scale; "
        "needs scales: ue8m0).",
    )
    at: Literal["sender", "engine"] = Field(
        default="sender",
        description="sender: each trainer rank quantises the whole blocks it sends (FP8 + scales on the wire, about "
        "half the bytes of bf16), bit for bit as the engine would; engine: the unquantised weights go on the wire and "
        "the engine quantises them in its reload.",
    )
    weights: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        description="Canonical weights served quantised (fnmatch globs). Default: the 2-D weights of the decoder "
        "layers but routers (*.mlp.gate.weight), norms, embeddings and lm_head: what vLLM quantises.",
    )
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Canonical weights (fnmatch globs) left unquantised.")


class SideSpec(_Strict):
    """One side's layout: a preset, its mesh, and overrides; or (``preset: none``) its own rules and axes."""

    preset: Literal["none", "hf", "megatron", "fsdp2", "vllm", "sglang"] = Field(
        description="Framework preset: " + ", ".join(PRESET_NAMES) + "; or none: no preset rules, only this side's "
        "rules, on the mesh axes it declares (axes: or mesh_family:)."
    )
    axes: list[AxisName] | None = Field(
        default=None,
        description="With preset: none: this side's mesh axes in rank order, fastest-varying first ([tp, dp]: "
        "rank = tp_coord + tp * dp_coord). An axis named pp is the pipeline axis (non-layer tensors on every stage "
        "unless a rule gives stage:); ep owns {expert} by default.",
    )
    mesh_family: Literal["megatron", "fsdp2", "vllm", "sglang", "hf"] | None = Field(
        default=None,
        description="With preset: none: number ranks, derive axes (Megatron's etp/ep/edp, the engines' ep/etp), "
        "split pipeline stages and place embeddings / final norm on them as this preset does; none of its rules.",
    )
    mesh: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="Mesh sizes by axis: megatron tp/pp/dp/cp/ep/etp; fsdp2 dp/tp/cp/dp_replicate; vllm/sglang tp/pp/ep; "
        "hf dp; preset none: the declared axes. Axes not given are 1.",
    )
    instances: int = Field(default=1, ge=1, description="Identical engine instances (rollout side).")
    dtype: DType | None = Field(default=None, description="Dtype of local tensors (default: the canonical dtype).")
    params: dict[str, int | bool | str] = Field(default_factory=dict, description="Preset params, e.g. vocab_multiple.")
    pipeline: PipelineSpec | None = None
    pins: dict[Annotated[int, Field(ge=0)], Annotated[str, Field(pattern="^[0-9a-f]{16}$")]] = Field(
        default_factory=dict,
        description=(
            "Layout fingerprints by rank (rollout: local rank within an instance), as `weightbridge probe` prints "
            "them. The spec's expansion must give them (a changed preset fails validation), and engine integrations "
            "check that probing the engine's loader gives them (a changed engine fails before any transfer)."
        ),
    )
    rules: list[Rule] = Field(
        default_factory=list,
        description="Rules added to the preset; a rule whose local template equals a preset rule's replaces it. "
        "With preset: none, the side's only rules.",
    )
    quantization: QuantizationSpec | None = Field(
        default=None,
        description="Rollout side: weights the engine serves quantised (FP8 E4M3 with block or row scales), and who "
        "quantises them. A pre-quantised (FP8) checkpoint implies it.",
    )

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> SideSpec:
        if info.context and info.context.get("located"):
            return self  # the caller reports side_problems() at their own paths
        problems = side_problems(self)
        if problems:
            raise ValueError("; ".join(message for _, message, _ in problems))
        return self


def side_problems(side: SideSpec | Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Cross-field problems of one side, each ``(field path under the side, message, hint)``.

    Takes the raw mapping too (fields of the wrong type are ignored), so that these are reported
    along with the side's schema errors."""
    get = side.get if isinstance(side, Mapping) else lambda key: getattr(side, key, None)
    preset, axes, family = get("preset"), get("axes"), get("mesh_family")
    if not isinstance(axes, list):
        axes = None if axes is None else []
    out: list[tuple[str, str, str]] = []
    quant = get("quantization")
    if isinstance(quant, Mapping):
        quant = dict(quant)
    elif quant is not None:
        quant = quant.model_dump()
    if isinstance(quant, dict) and quant.get("scale_dtype") == "float8_e8m0fnu" and quant.get("scales", "float32") != "ue8m0":
        out.append(("quantization.scale_dtype", "float8_e8m0fnu stores powers of two only",
                    "set scales: ue8m0, or scale_dtype: float32"))
    if preset != NO_PRESET:
        for key, value in (("axes", axes), ("mesh_family", family)):
            if value is not None and isinstance(preset, str):
                out.append((key, f"{key} goes with preset: none; the {preset} preset fixes its mesh axes",
                            f"remove {key}, or write preset: none and this side's own rules"))
        return out
    if axes is None and family is None:
        out.append(("preset", "preset: none needs the side's mesh axes: axes: [...] (rank order, fastest first) or mesh_family: NAME",
                    "e.g. axes: [tp, dp] for rank = tp_coord + tp * dp_coord"))
    elif axes is not None and family is not None:
        out.append(("mesh_family", "give axes or mesh_family, not both", "axes declares your own rank order; mesh_family borrows a preset's"))
    seen: set[str] = set()
    for i, axis in enumerate(axes or ()):
        if isinstance(axis, str) and axis in seen:
            out.append((f"axes[{i}]", f"axis {axis!r} is declared twice", "each axis once, fastest-varying first"))
        seen.add(axis)
    return out


MIN_ROUND_BYTES = 4096  # below a page, rounds are pure overhead (and the planner cuts units of round_bytes/4)
RoundBytes = Annotated[
    int,
    BeforeValidator(parse_bytes),
    Field(ge=MIN_ROUND_BYTES),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": MIN_ROUND_BYTES}, {"type": "string", "pattern": BYTES_PATTERN}],
            "description": f"Bytes, at least {MIN_ROUND_BYTES} (4KiB): an integer or a size such as '256MiB', '1GB'.",
        }
    ),
]


def _on_off(value: Any) -> Any:
    """YAML 1.1 reads a bare ``on`` / ``off`` as a boolean: take it as the word."""
    return ("on" if value else "off") if isinstance(value, bool) else value


OnOffAuto = Annotated[
    Literal["auto", "on", "off"],
    BeforeValidator(_on_off),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["auto", "on", "off"]}, {"type": "boolean"}]}),
]


def _auth_mode(v: Any) -> Any:
    return "off" if v is False else v  # YAML 1.1 reads `auth: off` as false


AuthMode = Annotated[
    Literal["required", "off"],
    BeforeValidator(_auth_mode),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["required", "off"]}, {"const": False}]}),
]


class SyncSpec(_Strict):
    """How updates are synchronised (consumed by the runtime)."""

    mode: Literal["sync", "async", "colocated"] = "sync"
    max_staleness: int = Field(default=1, ge=0, description="async: how many versions the trainer may run ahead.")
    round_bytes: RoundBytes = Field(default=1 << 30, description="Per-rank cap on wire-buffer bytes in one round (at least 4KiB).")
    transport: Literal["auto", "nccl", "gloo", "shm", "ipc"] = Field(
        default="auto",
        description="How bytes move. gloo / nccl: the wire for every pair. shm (CPU tensors): pairs on one host "
        "through shared memory (/dev/shm), the others over Gloo; ipc (CUDA tensors): pairs on one host through "
        "CUDA IPC, the others over NCCL. auto: shm on CPU; on CUDA ipc where a GPU holds a trainer and a rollout "
        "rank (colocated), else nccl; with sync.delta the wire alone (`weightbridge docs colocated`).",
    )
    # Bounded: an infinite or astronomically large deadline validated, then overflowed in from_spec (time arithmetic).
    timeout_s: float = Field(default=300.0, gt=0, le=86400, allow_inf_nan=False,
                             description="Deadline of every wait, in seconds (at most one day).")
    # Settings every rank must agree on: in the spec, so the spec hash (checked at the handshake) covers them.
    checksums: bool = Field(
        default=True,
        description="Append a checksum to every bucket and verify it on receipt (CRC-32 on CPU wire buffers, a "
        "64-bit polynomial hash on GPU ones): a corrupted update raises ChecksumError (staged receivers keep the "
        "previous version, in-place ones report torn). Cost: one checksum pass over each bucket on each end (CRC-32 runs at "
        "about 1 GB/s per CPU core; bench/transfer_gloo.py prints the ratio); false only where the link is trusted.",
    )
    store: Literal["trainer0", "external"] = Field(
        default="trainer0",
        description="Who hosts the control store at from_spec's host:port. trainer0: trainer rank 0 does (it must "
        "stop last; when it dies every rank raises StoreUnreachable). external: no bridge hosts it; every rank, "
        "trainer 0 included, connects to a store that outlives them (`weightbridge store`, or the launcher's "
        "weightbridge.open_store), and trainer 0 may then die and restart like any rank.",
    )
    receiver_dedup: OnOffAuto = Field(
        default="auto",
        description="Receiver de-replication: rollout instances forward replicated pieces to each other instead of "
        "each receiving them from the trainer; auto: as the cost model decides.",
    )
    delta: OnOffAuto = Field(
        default="off",
        description="Delta updates: each sender keeps what it last sent per planned bucket and sends a bucket as "
        "the elements that changed since (a bitmap or index runs, plus values) when that is smaller than the bucket; "
        "a receiver applies a delta only onto the exact version it was computed against (new epochs start full). "
        "auto: per bucket, from the measured change (a bucket that barely shrinks is sent in full for a while). "
        "Memory: each sender keeps one copy of the bytes it sends per push (the wire dtype, e.g. bf16); receivers "
        "none, but their receive tensors must only be written by the bridge (`weightbridge docs delta`).",
    )
    heartbeat_s: float = Field(
        default=1.0, gt=0, le=3600, allow_inf_nan=False,
        description="Heartbeat period in seconds; a rank silent for max(10 x heartbeat_s, 3 s) is declared dead.",
    )
    min_instances: int | None = Field(
        default=None, ge=1,
        description="Complete, live rollout instances every push waits for (default: all of rollout.instances). "
        "Fewer than all: late instances join a later push and a dead one is dropped.",
    )
    staging: bool | None = Field(
        default=None,
        description="Rollout ranks receive into a staging copy (true: one more copy of the rank's shard, where "
        "staging_memory says; the engine serves the old version until apply()) or in place (false: inside poll(), "
        "the rank is torn meanwhile; engines stream each tensor into their reload and hold about 2 x round_bytes, "
        "`weightbridge docs memory`). Default: true in async mode, false otherwise. A rank may override it "
        "(RolloutBridge.from_spec(staging=...)).",
    )
    staging_memory: Literal["device", "host"] = Field(
        default="device",
        description="Where a rollout rank's staging copy lives: device (next to its weights; apply() is a device "
        "copy) or host (CPU memory, pinned when the weights are on a GPU: no device memory for it, apply() copies "
        "host to device).",
    )

    auth: AuthMode = Field(
        default="required",
        description="required: every control message and data sender is authenticated with the job secret "
        "(WEIGHTBRIDGE_SECRET, BridgeOptions(secret=...) or secret_file); from_spec refuses to start without one. "
        "off: no authentication, only where nobody else can reach the control store and the bridge group "
        "(`weightbridge docs trust`).",
    )
    secret_file: str | None = Field(
        default=None, min_length=1,
        description="A file holding the job secret (relative to the spec file), used when neither "
        "BridgeOptions(secret=...) nor WEIGHTBRIDGE_SECRET is set. Never put the secret itself in the spec.",
    )

    def staged(self) -> bool:
        """Whether rollout ranks receive into a staging copy: ``staging``, else ``mode == "async"``."""
        return self.staging if self.staging is not None else self.mode == "async"


class Spec(_Strict):
    """A weightbridge spec (version 1)."""

    version: Literal[1] = Field(description="Spec format major version.")
    model: ModelSource
    trainer: SideSpec
    rollout: SideSpec
    sync: SyncSpec = Field(default_factory=SyncSpec)
    network: PresetName | NetworkSpec | None = Field(
        default=None, description="Network for the cost model: a preset name (h100, h200, gb200, cpu-gloo) or fields (`weightbridge docs planner`)."
    )
