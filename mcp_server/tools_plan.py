"""Tools ``plan_transfer`` (``weightbridge plan --json``) and ``explain_tensor`` (``weightbridge explain --json``)."""


import difflib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_server import specs, worker
from mcp_server.declared import ToolSet
from mcp_server.roots import ServerConfig, excerpt, fail
from weightbridge.layout.explain import explain_json, select_tensors
from weightbridge.plan.network import PresetName
from weightbridge.spec.errors import SpecErrors
from weightbridge.spec.models import MIN_ROUND_BYTES, parse_bytes
from weightbridge.spec.sides import round_bytes_problem
from weightbridge.ops.planning import plan_spec, top_imbalances

MAX_EXPLAINED = 200


class Placement(BaseModel):
    """Where the cost model puts the ranks (the assumption behind every predicted time)."""

    model_config = ConfigDict(extra="forbid")
    sides: Literal["disjoint", "shared", "colocated"] = Field(
        description="disjoint: each side on nodes of its own; shared: both sides on the same nodes; colocated: "
        "trainer rank i and rollout rank i on one GPU")
    ranks_per_node: int
    trainer_nodes: int
    rollout_nodes: int
    text: str


class PlanMetrics(BaseModel):
    """The `weightbridge plan --json` object (keys documented in weightbridge.plan.metrics)."""

    model_config = ConfigDict(extra="forbid")
    plan_hash: str
    num_rounds: int
    num_buckets: int
    num_items: int
    wire_bytes: int
    update_bytes: int
    exchange_bytes: int
    min_wire_bytes: int
    wire_bytes_by_dtype: dict[str, int] = Field(description="wire_bytes by wire dtype (FP8 values, fp32 scales, bf16, ...)")
    quantized_weights: int = Field(description="Weights the rollout receives quantised by the senders (rollout.quantization)")
    unquantized_wire_bytes: int | None = Field(None, description="wire_bytes were those weights unquantised, or null")
    fp8_wire_ratio: float | None = Field(None, description="wire_bytes / unquantized_wire_bytes (the FP8 saving), or null")
    max_sender_bytes: int
    mean_sender_bytes: float
    sender_balance: float
    sender_balance_bound: float
    max_receiver_bytes: int
    round_bytes: int
    max_round_rank_bytes: int
    max_stream_bytes: int = Field(0, description="Most bytes of local tensors a streaming rollout rank holds at once")
    receiver_dedup: bool
    predicted_seconds: float
    lower_bound_seconds: float
    baseline_seconds: float
    stall_seconds: float
    baseline_stall_seconds: float
    sync_mode: str
    network: str
    placement: Placement
    planning_seconds: float
    change_rate: float | None = Field(None, description="The change_rate asked for (expected share of elements a push changes)")
    delta_wire_bytes: int | None = Field(None, description="With delta updates (sync.delta) at change_rate: expected wire bytes")
    predicted_delta_seconds: float | None = Field(None, description="With delta updates at change_rate: cost model time")
    notes: list[str]
    problems: list[str]


class Imbalance(BaseModel):
    role: Literal["sender", "forwarder", "receiver"]
    side: Literal["trainer", "rollout"]
    rank: int
    bytes: int
    mean_bytes: float
    vs_mean: float = Field(description="bytes / mean bytes of the ranks with the same role")


class PlanResult(PlanMetrics):
    """The plan metrics plus whether the plan is valid and the busiest ranks relative to their role's mean."""

    valid: bool = Field(description="Every element each rollout rank needs arrives exactly once")
    top_imbalances: list[Imbalance] = Field(description="Busiest ranks first; empty when all ranks of a role move the same bytes")


class Piece(BaseModel):
    canonical: str = Field(description="Canonical (HF checkpoint) tensor name")
    canonical_box: list[list[int]] = Field(description="[start, stop) per dim of the canonical tensor")
    local_box: list[list[int]] = Field(description="[start, stop) per dim of the local tensor")
    transpose: bool = Field(description="The canonical box is stored with dims reversed")


class LocalTensor(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    pieces: list[Piece] = Field(description="Canonical boxes making up this tensor; empty for padding only")


class Explanation(BaseModel):
    """How local tensors of one rank are made of canonical boxes (the `weightbridge explain --json` format)."""

    side: str
    rank: int
    instance: int
    local_rank: int
    coords: dict[str, int] = Field(description="The rank's coordinate on every mesh axis")
    tensors: list[LocalTensor]


def plan(config: ServerConfig, spec_path: str | None, spec_text: str | None, network: str | None,
         round_bytes: int | str | None, receiver_dedup: str | None, imbalances: int,
         change_rate: float | None = None) -> PlanResult:
    """plan_transfer's work (in a worker process)."""
    cap = parse_bytes(round_bytes) if round_bytes is not None else None  # >= MIN_ROUND_BYTES: declared
    resolved = specs.resolve(config, spec_path, spec_text)
    too_fine = round_bytes_problem(resolved.rollout, cap) if cap is not None else None
    if too_fine is not None:  # as `weightbridge plan --round-bytes` refuses it: planning would not end in seconds
        raise fail("round_bytes", f"{too_fine[0]} ({too_fine[1]})")
    try:
        report = plan_spec(resolved, network=network, receiver_dedup=receiver_dedup, round_bytes=cap,
                           change_rate=change_rate)
    except SpecErrors as exc:
        raise fail(exc.problems[0].path, "\n".join(str(p) for p in exc.problems)) from None
    return PlanResult(**report.metrics, valid=not report.problems,
                      top_imbalances=top_imbalances(report.plan, imbalances))


def explain(config: ServerConfig, side: str, rank: int, tensor: str, spec_path: str | None,
            spec_text: str | None) -> Explanation:
    """explain_tensor's work (in a worker process)."""
    resolved = specs.resolve(config, spec_path, spec_text)
    layout = specs.rank_layout(resolved, side, rank)
    tensors = select_tensors(layout, tensor)
    if not tensors:
        names = [t.name for t in layout.tensors]
        close = difflib.get_close_matches(tensor, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; it holds e.g. {', '.join(names[:3])}"
        raise fail("tensor", f"no local tensor of {side} rank {rank} matches {excerpt(tensor)}{hint}")
    if len(tensors) > MAX_EXPLAINED:
        raise fail("tensor", f"{excerpt(tensor)} matches {len(tensors)} local tensors of {side} rank {rank}; "
                   f"narrow the glob (at most {MAX_EXPLAINED})")
    return Explanation.model_validate(explain_json(layout, tensors))


def register(tools: ToolSet, config: ServerConfig) -> None:
    @tools.tool(title="Plan a weight transfer", exactly_one_of=specs.ONE_SPEC)
    async def plan_transfer(
        spec_path: specs.SpecPath = None,
        spec_text: specs.SpecText = None,
        network: Annotated[
            PresetName | None, Field(description="Override the spec's network preset.")
        ] = None,
        round_bytes: Annotated[
            Annotated[int, Field(ge=MIN_ROUND_BYTES)] | specs.RoundBytesText | None,
            Field(description="Override sync.round_bytes: bytes (at least 4096) or a size such as 256MiB."),
        ] = None,
        receiver_dedup: Annotated[
            Literal["auto", "on", "off"] | None,
            Field(description="Override sync.receiver_dedup: rollout instances complete shards among themselves."),
        ] = None,
        imbalances: Annotated[int, Field(ge=0, le=50, description="How many top imbalances to list.")] = 5,
        change_rate: Annotated[
            float | None,
            Field(ge=0, le=1, allow_inf_nan=False,
                  description="Expected share of elements a push changes (e.g. 0.01): also price delta updates "
                  "(sync.delta)."),
        ] = None,
    ) -> PlanResult:
        """Dry-run the transfer plan of a spec: rounds, bytes per sender/receiver, balance, predicted time.

        Same fields as `weightbridge plan --json` (plus `valid` and `top_imbalances`). No process
        group, no GPU; runs in a worker process killed at the server's call limit or on cancellation.
        Give exactly one of spec_path or spec_text.
        """
        return await worker.call(config, plan, PlanResult, argument="spec_text" if spec_text is not None else "spec_path",
                                 spec_path=spec_path, spec_text=spec_text, network=network, round_bytes=round_bytes,
                                 receiver_dedup=receiver_dedup, imbalances=imbalances, change_rate=change_rate)

    @tools.tool(title="Explain a rank's local tensor", exactly_one_of=specs.ONE_SPEC)
    async def explain_tensor(
        side: specs.Side,
        rank: specs.Rank,
        tensor: Annotated[
            str,
            Field(min_length=1, max_length=1000, description="Glob over local tensor names or their canonical source names, "
                  "e.g. model.layers.0.self_attn.qkv_proj.weight or *.0.mlp.*"),
        ],
        spec_path: specs.SpecPath = None,
        spec_text: specs.SpecText = None,
    ) -> Explanation:
        """How one local tensor of one rank is composed of canonical boxes (`weightbridge explain --json`).

        Each piece says: these canonical elements (canonical_box of the canonical tensor) sit in
        local_box of the local tensor. At most 200 tensors per call; narrow the glob for more.
        """
        return await worker.call(config, explain, Explanation, argument="spec_text" if spec_text is not None else "spec_path",
                                 side=side, rank=rank, tensor=tensor, spec_path=spec_path, spec_text=spec_text)
