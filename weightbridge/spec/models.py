"""The spec, version 1: pydantic models that generate the JSON Schema in ``spec/schema/``.

A spec says which model (canonical tensors), how the trainer and the rollout side
lay it out (preset + mesh + overrides), and how updates are synchronised. Field
docs here are what editors show; the schema is regenerated with
``weightbridge schema`` and checked with ``weightbridge schema --check``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from weightbridge.layout.ir import DTYPE_ALIASES, DTYPE_BYTES, normalize_dtype
from weightbridge.layout.presets import PRESET_NAMES
from weightbridge.layout.rules import Rule
from weightbridge.plan.network import NetworkSpec, PresetName

SPEC_VERSION = 1

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


class SideSpec(_Strict):
    """One side's layout: a preset, its mesh, and overrides."""

    preset: Literal["hf", "megatron", "fsdp2", "vllm", "sglang"] = Field(description="Framework preset: " + ", ".join(PRESET_NAMES) + ".")
    mesh: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="Mesh sizes by axis: megatron tp/pp/dp/cp/ep/etp; fsdp2 dp/tp/cp/dp_replicate; vllm/sglang tp/pp/ep; hf dp.",
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
        description="Rules added to the preset; a rule whose local template equals a preset rule's replaces it.",
    )


class SyncSpec(_Strict):
    """How updates are synchronised (consumed by the runtime)."""

    mode: Literal["sync", "async", "colocated"] = "sync"
    max_staleness: int = Field(default=1, ge=0, description="async: how many versions the trainer may run ahead.")
    round_bytes: ByteSize = Field(default=1 << 30, description="Per-rank cap on wire-buffer bytes in one round.")
    transport: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_s: float = Field(default=300.0, gt=0, description="Deadline of every wait, in seconds.")


class Spec(_Strict):
    """A weightbridge spec (version 1)."""

    version: Literal[1] = Field(description="Spec format major version.")
    model: ModelSource
    trainer: SideSpec
    rollout: SideSpec
    sync: SyncSpec = Field(default_factory=SyncSpec)
    network: PresetName | NetworkSpec | None = Field(
        default=None, description="Network for the cost model: a preset name (h100, h200, cpu-gloo) or fields (docs/planner.md)."
    )
