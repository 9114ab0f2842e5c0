"""Tools ``generate_spec`` (draft a spec from a description) and ``validate_spec`` (``weightbridge validate --json``)."""


import os
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field

from mcp_server import specs, worker
from mcp_server.declared import ToolSet
from mcp_server.roots import MAX_PATH_CHARS, ServerConfig, clip, excerpt, fail, write_text_atomic
from weightbridge.canonical import bundled_names
from weightbridge.ops.draft import draft_spec, framework_notes
from weightbridge.spec.sides import unchecked_sides
from weightbridge.spec.resolve import check_text

TRAINER_AXES = Literal["tp", "pp", "dp", "cp", "ep", "etp", "dp_replicate"]  # the trainer presets' mesh axes
ROLLOUT_AXES = Literal["tp", "pp", "ep"]
Size = Annotated[int, Field(ge=1)]


MAX_PROBES = 256  # observed ranks per side: a fit compares each with the spec's expansion
MAX_PROBE_BYTES = 64 << 20  # a probe JSON lists a rank's pieces: tens of MB for the largest models
ProbesArg = Annotated[dict[Annotated[int, Field(ge=0, le=1 << 20)], Annotated[str, Field(min_length=1,
                                                                                       max_length=MAX_PATH_CHARS)]],
                      Field(max_length=MAX_PROBES)]
PROBES_DOC = ("Live observations: rank -> a `weightbridge probe ... -o FILE` JSON (inside the roots) of that rank's "
              "own loader. The draft then takes the preset facts that reproduce them (Megatron layer spec, expert "
              "MLP, etp; FSDP2 fused experts; SGLang CPU padding) and pins their fingerprints, so it passes "
              "`weightbridge probe --check` against the same processes; none reproducing them is an error naming "
              "the nearest.")


class TrainerSide(BaseModel):
    """The training framework and its parallelism."""

    model_config = ConfigDict(extra="forbid")
    framework: Literal["megatron", "fsdp2", "hf"] = Field(description="megatron (Megatron-Core), fsdp2 (FSDP2/DTensor) or hf")
    mesh: dict[TRAINER_AXES, Size] = Field(
        default_factory=dict,
        description="Mesh sizes by axis; megatron: tp, pp, dp, cp, ep, etp; fsdp2: dp, tp, cp, dp_replicate; hf: dp.",
    )
    probes: ProbesArg = Field(default_factory=dict, description=PROBES_DOC)


class RolloutSide(BaseModel):
    """The inference engine, its parallelism and how many identical engines."""

    model_config = ConfigDict(extra="forbid")
    engine: Literal["vllm", "sglang", "hf"] = Field(description="vllm, sglang or hf")
    mesh: dict[ROLLOUT_AXES, Size] = Field(default_factory=dict, description="Mesh sizes by axis: tp, pp, ep.")
    instances: int | None = Field(default=None, ge=1, description="Identical engine instances (default 1).")
    probes: ProbesArg = Field(default_factory=dict, description=PROBES_DOC + " Rollout: local rank within an instance.")


class GeneratedSpec(BaseModel):
    """A drafted spec that passed every check of ``weightbridge validate``."""

    yaml: str = Field(description="The spec text")
    assumed: list[str] = Field(description="Defaults filled in, one line each")
    summary: str = Field(description="What the spec resolves to")
    written_to: str | None = Field(description="The file written, when write_to was given")


class ValidationReport(BaseModel):
    """Every problem of a spec (empty and valid=true when it resolves)."""

    spec: str
    valid: bool
    problems: list[specs.Problem]
    summary: str | None = Field(description="Canonical tensors and ranks per side, when valid")
    warnings: list[str] = Field(default_factory=list, description="Sides whose layout was never checked against a "
                                "live loader (no pins), when valid")


def _argument(path: str) -> str:
    """The generate_spec argument behind a spec JSON path: $.rollout.mesh.tp -> rollout.mesh.tp."""
    parts = path.removeprefix("$").lstrip(".").replace("[", ".").split(".")
    head = parts[0]
    if head in ("trainer", "rollout"):
        if len(parts) > 1 and parts[1] in ("mesh", "instances"):
            return ".".join(parts[:3])
        return f"{head}.{'framework' if head == 'trainer' else 'engine'}"
    if head == "sync" and len(parts) > 1:
        return parts[1]
    return head or "model"


def _summary(resolved: Any) -> str:
    t, r = resolved.trainer, resolved.rollout
    per = r.world_size // max(1, r.num_instances)
    return (f"{len(resolved.canonical)} canonical tensors; trainer {t.world_size} ranks, "
            f"rollout {r.num_instances} x {per} ranks; spec hash {resolved.spec_hash}")


def _relative_model(source: dict[str, Any], base: Path) -> dict[str, Any]:
    """``source`` with its config / safetensors path relative to ``base`` (the spec file's directory)."""
    out = dict(source)
    for key in ("config", "safetensors"):
        if key in out:
            out[key] = Path(os.path.relpath(out[key], base)).as_posix()
    return out


def generate(config: ServerConfig, model: str, trainer: dict[str, Any], rollout: dict[str, Any], mode: str | None,
             round_bytes: str | None, transport: str | None = None, network: str | None = None,
             write_to: str | None = None, overwrite: bool = False) -> GeneratedSpec:
    """generate_spec's work (in a worker process)."""
    side_t, side_r = TrainerSide.model_validate(trainer), RolloutSide.model_validate(rollout)
    target: Path | None = config.writable(write_to, "write_to", overwrite=overwrite) if write_to else None
    source = specs.model_source(config, model)
    if "bundled" in source and model not in bundled_names():
        raise fail("model", f"{excerpt(model)} is neither a file nor a bundled model ({', '.join(bundled_names())})")
    base = target.parent if target else config.base_dir
    draft = draft_spec(_relative_model(source, base), trainer_preset=side_t.framework, trainer_mesh=side_t.mesh,
                       rollout_preset=side_r.engine, rollout_mesh=side_r.mesh, rollout_instances=side_r.instances,
                       mode=mode, round_bytes=round_bytes, transport=transport, network=network)
    resolved, problems = check_text(draft.text, str(target or "<draft>"), base_dir=base)
    if problems or resolved is None:
        raise ToolError(clip("\n".join(
            f"{_argument(p.path)}: {p.message}" + (f" ({p.hint})" if p.hint else "") + f" [spec path {p.path}]"
            for p in problems
        )))
    moe = int(dict(resolved.canonical.params).get("num_experts") or 0) > 0
    text, assumed = draft.text, draft.assumptions + framework_notes(side_t.framework, side_r.engine, moe=moe)
    for name, side in (("trainer", side_t), ("rollout", side_r)):
        if side.probes:
            text, notes = _fit(config, text, name, side.probes, base)
            assumed += notes
    if text != draft.text:
        resolved, problems = check_text(text, str(target or "<draft>"), base_dir=base)
        if problems or resolved is None:  # pins are the expansion's own fingerprints: unreachable
            raise ToolError(clip("\n".join(str(p) for p in problems)))
    if target is not None:
        write_text_atomic(target, text, "write_to")
    return GeneratedSpec(yaml=text, assumed=assumed, summary=_summary(resolved),
                         written_to=str(target) if target else None)


def _fit(config: ServerConfig, text: str, side: str, probes: dict[int, str], base: Path) -> tuple[str, list[str]]:
    """``text`` fitted to the live ranks of ``side`` (probe JSON files inside the roots)."""
    from weightbridge.ops.live_fit import FitError, fit_side
    from weightbridge.probe import read_probe_json

    observed = {}
    for rank, raw in sorted(probes.items()):
        path = config.readable(raw, f"{side}.probes[{rank}]", max_bytes=MAX_PROBE_BYTES)
        try:
            observed[rank] = read_probe_json(path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # deep JSON: recursion
            raise fail(f"{side}.probes[{rank}]", f"not a probe JSON ({excerpt(str(exc))})") from None
    try:
        fit = fit_side(text, side, observed, base_dir=base)
    except FitError as exc:
        raise fail(f"{side}.probes", clip(str(exc))) from None
    return fit.text, fit.notes


def validate(config: ServerConfig, spec_path: str | None, spec_text: str | None) -> ValidationReport:
    """validate_spec's work (in a worker process)."""
    resolved, problems = specs.check(config, spec_path, spec_text)
    return ValidationReport(
        spec=spec_path if spec_path is not None else "<spec_text>",
        valid=not problems,
        problems=specs.problems_out(problems),
        summary=_summary(resolved) if resolved is not None and not problems else None,
        warnings=unchecked_sides(resolved.spec) if resolved is not None and not problems else [],
    )


def register(tools: ToolSet, config: ServerConfig) -> None:
    _register_generate(tools, config)
    _register_validate(tools, config)


def _register_generate(tools: ToolSet, config: ServerConfig) -> None:
    async def run(**kwargs: Any) -> GeneratedSpec:
        kwargs["trainer"], kwargs["rollout"] = kwargs["trainer"].model_dump(), kwargs["rollout"].model_dump()
        return await worker.call(config, generate, GeneratedSpec, argument="model", **kwargs)

    ModelArg = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS,
                                    description="Bundled model name, or a HF config.json or safetensors path inside the "
                                    "server's roots (written relative to the spec's directory).")]
    ModeArg = Annotated[Literal["sync", "async", "colocated"] | None, Field(description="Update mode (default sync).")]
    RoundArg = Annotated[specs.RoundBytesText | None, Field(description="Per-rank wire cap per round, e.g. 256MiB "
                                                            "(default 1GiB).")]
    TransportArg = Annotated[Literal["auto", "nccl", "gloo"] | None, Field(
        description="sync.transport (default auto: NCCL for CUDA tensors, else Gloo); gloo (CPU) also makes the "
        "default network cpu-gloo.")]
    NetworkArg = Annotated[Literal["h100", "h200", "cpu-gloo"] | None, Field(
        description="Network preset of the plan's cost model (default: cpu-gloo for transport gloo, else h100).")]
    doc = ("Draft a weightbridge spec from a short description and check it like `weightbridge validate`.\n\n"
           "Returns the YAML and the defaults it assumed. A mesh that does not fit the model is an error naming "
           "the argument and the spec path (rollout.mesh.tp ... [spec path $.rollout.mesh.tp]).")
    if config.read_only:  # no write_to at all
        async def generate_spec(model: ModelArg, trainer: TrainerSide, rollout: RolloutSide, mode: ModeArg = None,
                                round_bytes: RoundArg = None, transport: TransportArg = None,
                                network: NetworkArg = None) -> GeneratedSpec:
            return await run(model=model, trainer=trainer, rollout=rollout, mode=mode, round_bytes=round_bytes,
                             transport=transport, network=network)

        tools.add_tool(generate_spec, title="Draft a spec", description=doc)
        return

    async def generate_spec(  # the variant that can write
        model: ModelArg, trainer: TrainerSide, rollout: RolloutSide, mode: ModeArg = None, round_bytes: RoundArg = None,
        transport: TransportArg = None, network: NetworkArg = None,
        write_to: Annotated[str | None, Field(min_length=1, max_length=MAX_PATH_CHARS,
                                              description="Also write the spec to this file (inside the server's roots).")] = None,
        overwrite: Annotated[bool, Field(description="Replace write_to if it exists.")] = False,
    ) -> GeneratedSpec:
        return await run(model=model, trainer=trainer, rollout=rollout, mode=mode, round_bytes=round_bytes,
                         transport=transport, network=network, write_to=write_to, overwrite=overwrite)

    tools.add_tool(generate_spec, title="Draft a spec",
                    description=doc + " With write_to, the spec is also written there (only inside the allowed roots).")


def _register_validate(tools: ToolSet, config: ServerConfig) -> None:
    @tools.tool(title="Validate a spec", exactly_one_of=specs.ONE_SPEC)
    async def validate_spec(spec_path: specs.SpecPath = None, spec_text: specs.SpecText = None) -> ValidationReport:
        """Check a spec (schema, model, mesh divisibility, coverage) and list every problem with its JSON path and line.

        Give exactly one of spec_path or spec_text. An invalid spec is a normal result (valid=false),
        not an error; an unreadable file is an error.
        """
        return await worker.call(config, validate, ValidationReport,
                                 argument="spec_text" if spec_text is not None else "spec_path",
                                 spec_path=spec_path, spec_text=spec_text)
