"""probe_layout: the CLI's probe in a subprocess on a loader factory the user names, diffed against the spec."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import ROOT, TINY, error_text, in_process, ok, run_session

from weightbridge.layout.ir import RankLayout, layout_hash

ZOO = "tests.probe._zoo:vllm_factory"  # a vLLM-like rank (fused qkv / gate_up, vocab-parallel embedding)


@pytest.mark.slow
def test_probe_matches_the_spec_and_writes_inside_roots(tmp_path: Path) -> None:
    out = tmp_path / "probe1.json"

    calls = [{"spec_path": TINY, "loader": ZOO, "rank": 1, "output": str(out)},
             {"spec_path": TINY, "loader": ZOO, "side": "trainer", "rank": 0}]

    async def body(c: Client):
        results: dict[int, object] = {}

        async def call(i: int) -> None:
            results[i] = await c.call_tool("probe_layout", calls[i])

        async with anyio.create_task_group() as tg:  # two probe subprocesses at once
            for i in range(len(calls)):
                tg.start_soon(call, i)
        return [results[i] for i in range(len(calls))]

    good, mismatch = run_session(in_process("auto", roots=(tmp_path, ROOT)), body)  # reads TINY (in ROOT)
    res = ok(good)
    assert res["matches_spec"] is True and res["differences"] == [] and res["verified"] is True
    assert res["written_to"] == str(out)
    obj = json.loads(out.read_text())
    assert res["hash"] == obj["hash"] == layout_hash([RankLayout.from_json(obj["layout"])])
    assert res["tensors"] == len(obj["layout"]["tensors"]) and f"hash {res['hash']}" in res["summary"]
    # A vLLM loader is not the FSDP2 trainer's layout: probing it as trainer rank 0 must list differences.
    other = ok(mismatch)
    assert other["matches_spec"] is False and other["differences"] and other["written_to"] is None
    assert {d["tensor"] for d in other["differences"]} >= {"model.layers.0.self_attn.qkv_proj.weight"}


BAD = [
    ({"loader": "no_such_module_xyz:f"}, "loader 'no_such_module_xyz:f': cannot import no_such_module_xyz"),
    ({"loader": "tests.probe._zoo:no_such_factory"}, "loader 'tests.probe._zoo:no_such_factory': tests.probe._zoo has no"),
    ({"loader": "-c import os"}, "loader: '-c import os' does not match ^[A-Za-z_]"),
    ({"loader": ZOO, "rank": 4}, "rank: 4 is out of range: the rollout has ranks 0..3"),
    ({"loader": ZOO, "output": "/etc/probe.json"}, "output: /etc/probe.json is outside the allowed roots"),
    ({"loader": ZOO, "spec_path": "tests/spec/data/five_mistakes.yaml"}, "spec_path: the spec has 5 problem(s)"),
]


@pytest.mark.parametrize(("args", "expect"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_probe_arguments(args: dict, expect: str) -> None:
    async def body(c: Client):
        return await c.call_tool("probe_layout", {"spec_path": TINY, **args})

    assert expect in error_text(run_session(in_process("legacy"), body), "probe_layout")
