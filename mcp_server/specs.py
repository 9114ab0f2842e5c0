"""Spec arguments shared by the tools: a spec file path or inline YAML text, and its problems."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from mcp_server.roots import ServerConfig, fail
from weightbridge.layout.ir import RankLayout
from weightbridge.spec.errors import SpecProblem
from weightbridge.spec.resolve import ResolvedSpec, check_spec, check_text

SpecPath = Annotated[
    str | None,
    Field(description="Path of a weightbridge spec (YAML), relative to the server's working directory."),
]
SpecText = Annotated[
    str | None,
    Field(description="The spec's YAML text instead of a path; relative model paths resolve against the working directory."),
]
Side = Annotated[Literal["trainer", "rollout"], Field(description="Which side of the spec: trainer or rollout.")]
Rank = Annotated[int, Field(ge=0, description="Rank within the side (rollout ranks count across instances).")]


class Problem(BaseModel):
    """One spec problem, located by JSON path and line (``weightbridge validate`` prints the same)."""

    file: str
    line: int | None
    path: str = Field(description="JSON path in the spec, e.g. $.rollout.mesh.tp")
    message: str
    hint: str


def problems_out(problems: list[SpecProblem]) -> list[Problem]:
    return [Problem.model_validate(p.to_json()) for p in problems]


def check(config: ServerConfig, spec_path: str | None, spec_text: str | None) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Check exactly one of ``spec_path`` / ``spec_text``; an unreadable file is a ToolError naming ``spec_path``."""
    if (spec_path is None) == (spec_text is None):
        raise fail("spec_path", "give exactly one of spec_path or spec_text")
    if spec_text is not None:
        return check_text(spec_text, "<spec_text>", base_dir=config.base_dir)
    path = config.resolve(spec_path or "")
    if not path.is_file():
        raise fail("spec_path", f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    return check_spec(path)


def resolve(config: ServerConfig, spec_path: str | None, spec_text: str | None) -> ResolvedSpec:
    """The resolved spec, or a ToolError listing every problem as ``file:line: $.path: message (hint)``."""
    resolved, problems = check(config, spec_path, spec_text)
    if problems or resolved is None:
        lines = "\n".join(str(p) for p in problems)
        raise fail("spec_text" if spec_text is not None else "spec_path", f"the spec has {len(problems)} problem(s):\n{lines}")
    return resolved


def rank_layout(resolved: ResolvedSpec, side: str, rank: int) -> RankLayout:
    """One rank's layout, or a ToolError naming ``rank`` with the side's range."""
    layout = resolved.side(side)
    if rank >= layout.world_size:
        raise fail("rank", f"{rank} is out of range: the {side} has ranks 0..{layout.world_size - 1}")
    return layout.ranks[rank]
