"""Spec and model arguments shared by the tools: a spec file path or inline YAML text, its problems, a model.

Run in a worker process (:mod:`mcp_server.worker`). A spec file must lie inside the roots, be a
regular file of at most ``MAX_SPEC_BYTES`` and be UTF-8 text; problems are reported with bounded
messages (a value of the spec is quoted only as a short excerpt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

import os

from mcp_server.roots import MAX_PATH_CHARS, ServerConfig, check_path_text, clip, fail, short_path
from weightbridge.canonical import bundled_names
from weightbridge.ops.models import source_for
from weightbridge.layout.ir import RankLayout
from weightbridge.spec.errors import SpecProblem
from weightbridge.spec.resolve import ResolvedSpec, check_text

MAX_SPEC_BYTES = 1 << 20  # a spec is a page of YAML; 1 MiB is generous
MAX_PROBLEMS = 100

SpecPath = Annotated[
    str | None,
    Field(min_length=1, max_length=MAX_PATH_CHARS,
          description="Path of a weightbridge spec (YAML) inside the server's roots, relative to its working directory."),
]
SpecText = Annotated[
    str | None,
    Field(max_length=MAX_SPEC_BYTES,
          description="The spec's YAML text instead of a path; relative model paths resolve against the working directory."),
]
ONE_SPEC = ("spec_path", "spec_text")  # a tool taking a spec: exactly one of them (declared as oneOf)
# A size of at least MIN_ROUND_BYTES (4096) as parse_bytes reads it, as a pattern a JSON Schema can declare:
# >= 4096 without a unit (or B), >= 4 KiB, >= 5 KB, >= 1 of MB/MiB and above (the integer part decides).
ROUND_BYTES_PATTERN = (  # spaces as [ \t]: engines disagree on what \s is (Python's includes \x1c-\x1f, Rust's not)
    r"^[ \t]*0*(?:(?:409[6-9]|4[1-9][0-9]{2}|[5-9][0-9]{3}|[1-9][0-9]{4,})(?:\.[0-9]+)?[ \t]*[Bb]?"
    r"|(?:[4-9]|[1-9][0-9]+)(?:\.[0-9]+)?[ \t]*[Kk][Ii][Bb]|(?:[5-9]|[1-9][0-9]+)(?:\.[0-9]+)?[ \t]*[Kk][Bb]"
    r"|[1-9][0-9]*(?:\.[0-9]+)?[ \t]*[MmGgTt][Ii]?[Bb])[ \t]*$"
)
RoundBytesText = Annotated[str, Field(
    pattern=ROUND_BYTES_PATTERN, max_length=64,
    description="a size of at least 4KiB such as 256MiB: bytes (>= 4096), KiB (>= 4), KB (>= 5), or MB, MiB, GB, "
    "GiB, TB, TiB (>= 1)")]
Side = Annotated[Literal["trainer", "rollout"], Field(description="Which side of the spec: trainer or rollout.")]
Rank = Annotated[int, Field(ge=0, description="Rank within the side (rollout ranks count across instances).")]


class Problem(BaseModel):
    """One spec problem, located by JSON path and line (``weightbridge validate`` prints the same)."""

    file: str
    line: int | None
    path: str = Field(description="JSON path in the spec, e.g. $.rollout.mesh.tp")
    message: str
    hint: str


def _bounded(p: SpecProblem) -> SpecProblem:
    """The problem with its message, hint and path at most one line of ``LINE_CHARS`` each."""
    def one(text: str) -> str:
        return clip(text, max_lines=1).replace("\n", " ")

    return SpecProblem(one(p.path), one(p.message), one(p.hint), p.file, p.line)


def problems_out(problems: list[SpecProblem]) -> list[Problem]:
    out = [Problem.model_validate(_bounded(p).to_json()) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        out.append(Problem(file=problems[0].file, line=None, path="$", message=f"... and {len(problems) - MAX_PROBLEMS} more problem(s)",
                           hint="fix these first"))
    return out


def read_spec_file(config: ServerConfig, spec_path: str) -> tuple[str, Path]:
    """The text of the spec file ``spec_path`` (inside the roots, a regular file, UTF-8) and its resolved path."""
    path = config.readable(spec_path, "spec_path", max_bytes=MAX_SPEC_BYTES)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail("spec_path", f"{short_path(path)}: cannot read ({exc.strerror or type(exc).__name__})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail("spec_path", f"{short_path(path)}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                   "a spec is a YAML text file") from None
    if "\x00" in text:
        raise fail("spec_path", f"{short_path(path)}: contains a NUL byte (offset {text.index(chr(0))}); a spec is a YAML text file")
    return text, path


def check(config: ServerConfig, spec_path: str | None, spec_text: str | None) -> tuple[ResolvedSpec | None, list[SpecProblem]]:
    """Check exactly one of ``spec_path`` / ``spec_text``; an unreadable file is a ToolError naming ``spec_path``."""
    if (spec_path is None) == (spec_text is None):
        raise fail("spec_path", "give exactly one of spec_path or spec_text")
    if spec_text is not None:
        if len(spec_text) > MAX_SPEC_BYTES:
            raise fail("spec_text", f"{len(spec_text)} characters is too long (at most {MAX_SPEC_BYTES})")
        return check_text(spec_text, "<spec_text>", base_dir=config.base_dir)
    text, path = read_spec_file(config, spec_path or "")
    return check_text(text, str(path), base_dir=path.parent)


def resolve(config: ServerConfig, spec_path: str | None, spec_text: str | None) -> ResolvedSpec:
    """The resolved spec, or a ToolError listing every problem as ``file:line: $.path: message (hint)``."""
    resolved, problems = check(config, spec_path, spec_text)
    if problems or resolved is None:
        lines = "\n".join(str(_bounded(p)) for p in problems)
        raise fail("spec_text" if spec_text is not None else "spec_path", f"the spec has {len(problems)} problem(s):\n{lines}")
    return resolved


def _looks_like_path(model: str) -> bool:
    return "/" in model or os.sep in model or model.startswith(("~", ".")) or model.endswith((".json", ".safetensors"))


def model_source(config: ServerConfig, model: str, dtype: str | None = None, argument: str = "model") -> dict:
    """The spec ``model:`` mapping a tool's model argument means: a bundled name, or a path inside the roots.

    A name that is not bundled and does not look like a path comes back as ``{"bundled": NAME}``
    (loading it says "unknown bundled model" with a did-you-mean).
    """
    if model in bundled_names():
        return source_for(model, dtype) if not (config.base_dir / model).exists() else source_for(
            str(config.readable(model, argument, directory_ok=True)), dtype)
    check_path_text(model, argument)
    if _looks_like_path(model) or config.resolve(model).exists():
        return source_for(str(config.readable(model, argument, directory_ok=True)), dtype)
    src: dict = {"bundled": model}
    if dtype:
        src["dtype"] = dtype
    return src


def rank_layout(resolved: ResolvedSpec, side: str, rank: int) -> RankLayout:
    """One rank's layout, or a ToolError naming ``rank`` with the side's range."""
    layout = resolved.side(side)
    if rank >= layout.world_size:
        raise fail("rank", f"{rank} is out of range: the {side} has ranks 0..{layout.world_size - 1}")
    return layout.ranks[rank]
