"""The rule vocabulary: how one local tensor is composed of canonical tensors.

A rule names a local tensor (a template) and one *body*:

* ``canonical`` (+ ``pad``, ``shard``, ``transpose``): one canonical tensor, padded
  then sharded step by step. Each shard step chunks the current extent of a dim
  over a mesh axis (``torch.chunk`` semantics); steps apply in order, so
  ``[{dim: 0, axis: tp}, {dim: 0, axis: dp, uneven: true}]`` is FSDP2-on-TP
  (DTensor ``_StridedShard(0)`` on dp, ``Shard(0)`` on tp).
* ``concat``: parts (each with its own pad/shard) concatenated along ``dim``
  (vLLM ``qkv_proj``/``gate_up_proj``, Megatron ``linear_fc1`` = [gate; up]).
* ``interleave``: each part viewed as ``groups`` blocks along ``dim``; the rank
  holds its groups (sharded over ``axis``), each laid out as [part0 block, part1
  block, ...] (Megatron GQA ``linear_qkv``: per query group [q..., k, v]).

``stack`` adds a leading dim over experts (vLLM/SGLang fused ``w13``/``w2``). The
resulting IR is documented in ``weightbridge.layout.ir``. Pure; no torch.

A part may first take a sub-box of its canonical tensor (``slice``: fused checkpoint tensors
such as Phi-3's ``qkv_proj``, split by the engine per rank into its own [q; k; v] shards) and
may store its block with its dims permuted (``permute``, torch's ``Tensor.permute`` order:
gpt-oss's ``[E, H, 2I]`` experts held as ``[E, 2I, H]``). Order of operations, all in the
canonical frame but the last: slice, pad, shard, then permute (or ``transpose``) into the local
frame.

``shard`` also takes a shorthand for tensor parallelism over the ``tp`` axis:
``shard: column`` = ``[{dim: 0, axis: tp}]`` (a column-parallel linear: output rows, and its
bias) and ``shard: row`` = ``[{dim: 1, axis: tp}]`` (a row-parallel linear: input columns; its
bias is replicated, so give it no ``shard``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

IntExpr = int | str  # an integer or an expression over params and mesh sizes (weightbridge.layout.expr)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShardOp(_Strict):
    """Chunk the current extent of tensor dim ``dim`` over mesh axis ``axis``."""

    dim: int = Field(ge=0, description="Tensor dim to shard (0 = rows).")
    axis: str = Field(description="Mesh axis name (tp, dp, ep, etp, ...).")
    blocks: IntExpr | None = Field(
        default=None,
        description="Split the extent into this many equal blocks (e.g. num_kv_heads) and deal whole blocks to ranks.",
    )
    replicate: bool = Field(
        default=False,
        description="With fewer blocks than ranks, replicate each block on size/blocks consecutive ranks "
        "(vLLM's KV heads when tp > num_kv_heads); otherwise that is an error.",
    )
    uneven: bool = Field(default=False, description="Allow torch.chunk-style uneven chunks (FSDP2); else sizes must divide.")


# ``shard: column`` / ``shard: row``: tensor parallelism over the ``tp`` axis (dim, axis).
SHARD_SHORTHANDS: dict[str, tuple[int, str]] = {"column": (0, "tp"), "row": (1, "tp")}


def _expand_shard(value: Any) -> Any:
    """``"column"`` / ``"row"`` -> the shard steps they stand for; anything else is left for pydantic."""
    if isinstance(value, str) and value in SHARD_SHORTHANDS:
        dim, axis = SHARD_SHORTHANDS[value]
        return [{"dim": dim, "axis": axis}]
    return value


def _shard_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``shard``: a list of steps, or one of the shorthands."""
    steps = {k: schema.pop(k) for k in ("type", "items") if k in schema}
    schema["anyOf"] = [steps, {"type": "string", "enum": sorted(SHARD_SHORTHANDS)}]


ShardSteps = Annotated[list[ShardOp], BeforeValidator(_expand_shard)]
_SHARD_DOC = (
    "Shard steps, applied in order; or a shorthand over the tp axis: 'column' = [{dim: 0, axis: tp}] "
    "(column-parallel linear), 'row' = [{dim: 1, axis: tp}] (row-parallel linear)."
)


class PadOp(_Strict):
    """Pad dim ``dim`` up to a multiple; padded elements map to nothing (vocab padding)."""

    dim: int = Field(ge=0)
    multiple: IntExpr


class SliceOp(_Strict):
    """Keep ``[start, stop)`` of dim ``dim`` of the canonical tensor (before padding and sharding)."""

    dim: int = Field(ge=0, description="Canonical dim to slice.")
    start: IntExpr = Field(default=0, description="First index kept (an integer or an expression, e.g. num_heads * head_dim).")
    stop: IntExpr | None = Field(default=None, description="One past the last index kept; omitted: the end of the dim.")


_SLICE_DOC = (
    "Sub-box of the canonical tensor this part takes, one step per dim (applied before pad and shard): "
    "a fused checkpoint tensor such as qkv_proj = [q; k; v] entering a local tensor in pieces."
)
_PERMUTE_DOC = (
    "The local tensor stores this part's block with its dims permuted, in Tensor.permute order "
    "(local dim j is block dim permute[j]); [0, 2, 1] turns an [E, H, N] block into [E, N, H]."
)


MAX_PERMUTE_DIMS = 8  # permuted_pieces tries every subset of dims to keep whole: 2**8 at most


def _is_permutation(perm: list[int] | None) -> list[int] | None:
    if perm is not None and len(perm) > MAX_PERMUTE_DIMS:
        raise ValueError(f"permute of {len(perm)} dims; at most {MAX_PERMUTE_DIMS}")
    if perm is not None and sorted(perm) != list(range(len(perm))):
        raise ValueError(f"permute must be a permutation of 0..{len(perm) - 1}, got {perm}")
    return perm


Permutation = Annotated[list[int] | None, AfterValidator(_is_permutation)]


class Part(_Strict):
    """One canonical tensor as it enters a local tensor."""

    canonical: str = Field(description="Canonical (HF checkpoint) name template, e.g. model.layers.{layer}.mlp.up_proj.weight")
    slice: list[SliceOp] = Field(default_factory=list, description=_SLICE_DOC)
    pad: PadOp | None = None
    shard: ShardSteps = Field(default_factory=list, description=_SHARD_DOC, json_schema_extra=_shard_schema)
    transpose: bool = Field(default=False, description="The local tensor stores this part transposed (2-D).")
    permute: Permutation = Field(default=None, description=_PERMUTE_DOC)

    @model_validator(mode="after")
    def _one_layout(self) -> Part:
        if self.transpose and self.permute is not None:
            raise ValueError("transpose and permute both given: transpose is permute [1, 0]; keep one")
        return self


class Concat(_Strict):
    dim: int = Field(ge=0)
    parts: list[Part] = Field(min_length=1)


class Interleave(_Strict):
    dim: int = Field(ge=0)
    groups: IntExpr = Field(description="Number of groups each part splits into along dim (e.g. num_kv_heads).")
    axis: str | None = Field(default=None, description="Mesh axis the groups are dealt over (e.g. tp).")
    parts: list[Part] = Field(min_length=1)


class Stack(_Strict):
    """Leading local dim over experts: local index i holds expert ``first + i``."""

    count: IntExpr = Field(description="Number of experts (e.g. num_experts).")
    axis: str | None = Field(default=None, description="Mesh axis experts are dealt over (e.g. ep).")
    uneven: bool = Field(default=False, description="Deal experts as torch.chunk does (FSDP2's dim-0 shards of a "
                         "fused [E, ...] tensor); else the count must divide.")


class Rule(_Strict):
    """One local tensor (template) and how it is made of canonical tensors."""

    local: str = Field(description="Local tensor name template; may use {layer} {local_layer} {expert} {local_expert} {*}.")
    # --- body: exactly one of canonical / concat / interleave
    canonical: str | None = None
    slice: list[SliceOp] = Field(default_factory=list, description=_SLICE_DOC)
    pad: PadOp | None = None
    shard: ShardSteps = Field(default_factory=list, description=_SHARD_DOC, json_schema_extra=_shard_schema)
    transpose: bool = False
    permute: Permutation = Field(default=None, description=_PERMUTE_DOC)
    concat: Concat | None = None
    interleave: Interleave | None = None
    stack: Stack | None = None
    # --- applicability
    when: str | bool | None = Field(default=None, description="Expression over params and mesh sizes, e.g. 'tie_word_embeddings and pp > 1'.")
    requires: list[str] = Field(default_factory=list, description="Canonical templates that must exist for a binding to apply.")
    unless: list[str] = Field(default_factory=list, description="Canonical templates whose existence disables a binding.")
    stage: Literal["first", "last", "all"] | None = Field(default=None, description="Pipeline stage(s) holding a non-layer tensor.")
    expert_axis: str = Field(default="ep", description="Mesh axis owning {expert} when the rule does not stack experts.")
    dtype: str | None = Field(
        default=None,
        description="Local dtype; 'canonical' keeps the canonical tensor's dtype, 'model' uses the side's (or the model's) dtype.",
    )

    @model_validator(mode="after")
    def _one_body(self) -> Rule:
        bodies = [b for b in ("canonical", "concat", "interleave") if getattr(self, b) is not None]
        if len(bodies) != 1:
            raise ValueError(f"a rule needs exactly one of canonical / concat / interleave, got {bodies or 'none'}")
        if self.canonical is None and (self.slice or self.pad or self.shard or self.transpose or self.permute is not None):
            raise ValueError("slice / pad / shard / transpose / permute at rule level go with 'canonical'; put them on each part")
        if self.transpose and self.permute is not None:
            raise ValueError("transpose and permute both given: transpose is permute [1, 0]; keep one")
        return self

    def parts(self) -> list[Part]:
        """The canonical parts in layout order."""
        if self.canonical is not None:
            return [Part(canonical=self.canonical, slice=self.slice, pad=self.pad, shard=self.shard,
                         transpose=self.transpose, permute=self.permute)]
        if self.concat is not None:
            return list(self.concat.parts)
        assert self.interleave is not None
        return list(self.interleave.parts)

    @property
    def is_fallback(self) -> bool:
        return self.canonical == "{*}"
