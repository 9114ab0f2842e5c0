"""Tool ``inspect_model``: a model's canonical tensors, grouped by name pattern (``weightbridge models NAME --json``)."""


from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from mcp_server import specs, worker
from mcp_server.declared import ToolSet
from mcp_server.roots import MAX_PATH_CHARS, ServerConfig, fail
from weightbridge.canonical import CanonicalSourceError, bundled_names, load_canonical
from weightbridge.canonical.describe import summarize
from weightbridge.spec.models import DTYPE_NAMES


class TensorGroup(BaseModel):
    pattern: str = Field(description="Canonical names with every numeric component replaced by *")
    count: int
    shapes: list[list[int]] = Field(description="Distinct shapes in first-seen order (usually one)")
    dtypes: list[str]
    numel: int
    bytes: int


class DtypeTotals(BaseModel):
    tensors: int
    numel: int
    bytes: int


class Totals(BaseModel):
    tensors: int
    numel: int
    bytes: int
    by_dtype: dict[str, DtypeTotals]


class ModelSummary(BaseModel):
    """The canonical (HF checkpoint) tensors of a model, grouped by layer pattern."""

    source: str = Field(description="Where the tensors came from, e.g. bundled:qwen2.5-7b")
    model: dict[str, Any] = Field(description="The spec `model:` mapping that means this model")
    params: dict[str, Any] = Field(description="Derived params usable in rule expressions (num_kv_heads, ...)")
    groups: list[TensorGroup]
    totals: Totals


def inspect(config: ServerConfig, model: str, dtype: str | None) -> ModelSummary:
    """inspect_model's work (in a worker process: a big config can take long)."""
    source = specs.model_source(config, model, dtype)
    try:
        summary = summarize(load_canonical(source, config.base_dir))
    except CanonicalSourceError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        raise fail("model", f"{exc.message}{hint}") from None
    return ModelSummary(model=source, **summary)


def register(tools: ToolSet, config: ServerConfig) -> None:
    names = bundled_names()

    @tools.tool(title="Inspect a model's canonical tensors")
    async def inspect_model(
        model: Annotated[
            str,
            Field(
                min_length=1, max_length=MAX_PATH_CHARS,
                description="A bundled model name (" + ", ".join(names) + "), a HF config.json (or its directory), "
                "or a safetensors checkpoint (file, index or directory; headers only), inside the server's roots.",
            ),
        ],
        dtype: Annotated[
            Literal[tuple(DTYPE_NAMES)] | None,  # type: ignore[valid-type]
            Field(description="Floating dtype to assume instead of the checkpoint's (e.g. bfloat16)."),
        ] = None,
    ) -> ModelSummary:
        """The canonical tensors of a model (names, shapes, dtypes, byte totals), grouped by layer pattern.

        Canonical = what HF `save_pretrained` writes: per-expert names, full unsharded shapes.
        The result's `model` is the mapping to put under `model:` in a spec.
        """
        return await worker.call(config, inspect, ModelSummary, argument="model", model=model, dtype=dtype)
