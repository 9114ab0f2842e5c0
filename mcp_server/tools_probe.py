"""Tool ``probe_layout``: run ``weightbridge probe`` on a loader callable the user names, in a subprocess.

The user's code (their engine's ``load_weights``) never runs in the server process: the
probe is the CLI's, run with a deadline in its own process group; a worker process
(:mod:`mcp_server.worker`) then reads the probe JSON and, with ``check``, diffs it against
the spec's expansion of that rank.
"""


import json
import re
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from mcp_server import scratch, specs, worker
from mcp_server.declared import ToolSet
from mcp_server.roots import MAX_PATH_CHARS, ServerConfig, clip, fail
from mcp_server.subproc import run_group

_CLI_FLAGS = re.compile(r"--(loader|rank|side)\b")


class TensorDifference(BaseModel):
    tensor: str
    message: str
    only_in_probe: list[str] = Field(description="Pieces the loader produced that the spec does not (first 3)")
    only_in_spec: list[str] = Field(description="Pieces the spec expects that the loader did not produce (first 3)")


class ProbeReport(BaseModel):
    """What probing the loader found for one rank."""

    hash: str = Field(description="Layout hash of the probed IR (equal hashes mean identical layouts)")
    tensors: int
    pieces: int
    verified: bool = Field(description="A real load of random weights matched the IR on every element it covers")
    changed: dict[str, str] = Field(description="Local tensors the loader changed numerically (left out of the IR)")
    casts: list[str]
    skipped: list[str]
    calls: int = Field(description="Probe calls of load_weights (rounds x chunks)")
    summary: str
    written_to: str | None = Field(description="The probe JSON, when output was given")
    matches_spec: bool | None = Field(description="With check: the probed IR equals the spec's expansion of this rank")
    differences: list[TensorDifference] = Field(description="With check: per-tensor differences (first 20)")


class _Prepared(BaseModel):
    spec: str
    target: str | None


def prepare(config: ServerConfig, spec_path: str, side: str, rank: int, output: str | None,
            overwrite: bool) -> _Prepared:
    """probe_layout's checks before the probe runs (in a worker process): the spec resolves, the rank exists."""
    target = config.writable(output, "output", overwrite=overwrite) if output else None
    _, path = specs.read_spec_file(config, spec_path)
    specs.rank_layout(specs.resolve(config, spec_path, None), side, rank)
    return _Prepared(spec=str(path), target=str(target) if target else None)


def compare(config: ServerConfig, spec_path: str, side: str, rank: int, probe: dict, check: bool,
            summary: str, written_to: str | None) -> ProbeReport:
    """probe_layout's report (in a worker process): the probe JSON, diffed against the spec's expansion with ``check``."""
    from weightbridge.layout.ir import RankLayout
    from weightbridge.probe.diff import diff_layouts

    obj = probe
    got = RankLayout.from_json(obj["layout"])
    diffs = diff_layouts(got, specs.rank_layout(specs.resolve(config, spec_path, None), side, rank)) if check else []
    return ProbeReport(
        hash=obj["hash"], tensors=len(got.tensors), pieces=sum(len(t.pieces) for t in got.tensors),
        verified=obj["verified"], changed=obj["changed"], casts=obj["casts"], skipped=obj["skipped"],
        calls=obj["calls"], summary=clip(summary), written_to=written_to,
        matches_spec=(not diffs) if check else None,
        differences=[
            TensorDifference(tensor=d.name, message=clip(d.message), only_in_probe=[str(p) for p in d.only_a[:3]],
                             only_in_spec=[str(p) for p in d.only_b[:3]])
            for d in diffs[:20]
        ],
    )


def register(tools: ToolSet, config: ServerConfig) -> None:
    @tools.tool(title="Probe an engine's loader")
    async def probe_layout(
        spec_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS,
                                        description="Spec whose model: gives the canonical tensors (inside the server's roots).")],
        loader: Annotated[
            str,
            Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$", max_length=500,
                  description="MODULE:CALLABLE, importable from the server's working directory: a callable (a function "
                  "or class) called as CALLABLE(resolved_spec, side, rank) that builds one rank of the engine and returns "
                  "an object with load_weights(iterable) and params(), or a (load_weights, destinations) pair."),
        ],
        ctx: Context,
        side: specs.Side = "rollout",
        rank: specs.Rank = 0,
        check: Annotated[bool, Field(description="Also diff the probed IR against the spec's expansion.")] = True,
        output: Annotated[str | None, Field(min_length=1, max_length=MAX_PATH_CHARS,
                                            description="Write the probe JSON here (inside the server's roots).")] = None,
        overwrite: Annotated[bool, Field(description="Replace output if it exists.")] = False,
        timeout_s: Annotated[int, Field(ge=1, le=config.max_timeout_s, description="Wall-clock limit for the probe "
                                        "subprocess (at most the server's --max-timeout).")] = min(300, config.max_timeout_s),
    ) -> ProbeReport:
        """Recover one rank's layout IR from the engine's own load_weights (the loader is the truth).

        Runs `weightbridge probe` in a subprocess with a deadline, calling the loader callable
        MODULE:CALLABLE. With check (default), compares the result with what the spec says that
        rank holds and lists the differences.
        """
        ready = await worker.call(config, prepare, _Prepared, argument="spec_path", spec_path=spec_path, side=side,
                                  rank=rank, output=output, overwrite=overwrite)
        with scratch.call_dir(config, "wb-probe-") as tmp:  # inside the roots; the probe's TMPDIR
            out = Path(ready.target) if ready.target else Path(tmp) / "probe.json"
            argv = [sys.executable, "-m", "weightbridge", "probe", ready.spec, "--loader", loader,
                    "--side", side, "--rank", str(rank), "-o", str(out)]
            await ctx.report_progress(0, 1, f"probing {side} rank {rank} with {loader}")
            fin = await run_group(argv, cwd=config.base_dir, timeout_s=timeout_s, scratch=Path(tmp),
                                  env=scratch.child_env(config, Path(tmp)))
            if fin.timed_out:
                raise fail("timeout_s", f"the probe did not finish within {timeout_s} s; its process group was killed")
            if fin.returncode == 2:  # a user error the CLI explains on stderr
                text = fin.stderr.strip().removeprefix("weightbridge probe: ")
                raise ToolError(clip(_CLI_FLAGS.sub(r"\1", text)))
            if not out.is_file():
                last = (fin.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise fail("loader", f"{loader} failed (exit {fin.returncode}): {last}")
            try:
                probe = json.loads(out.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise fail("loader", f"the probe wrote no readable JSON ({type(exc).__name__})") from None
            report = await worker.call(config, compare, ProbeReport, argument="spec_path", spec_path=spec_path,
                                       side=side, rank=rank, probe=probe, check=check, summary=fin.stdout.strip(),
                                       written_to=ready.target)
        await ctx.report_progress(1, 1, "probed")
        return report
