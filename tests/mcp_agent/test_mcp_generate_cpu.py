"""generate_spec for a CPU (Gloo) setup: the committed output, relative model paths, the matching network.

``data/generated_cpu_spec.yaml`` is generate_spec's output as-is for the call in CPU_CALL (server
working directory and root: ``data/``). Refresh it after changing the drafting with::

    WEIGHTBRIDGE_REFRESH_GENERATED=1 python -m pytest -q tests/mcp_agent/test_mcp_generate_cpu.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import error_text, in_process, ok, run_session

from weightbridge.spec.resolve import check_spec

DATA = Path(__file__).resolve().parent / "data"
GENERATED = DATA / "generated_cpu_spec.yaml"
CPU_CALL = {"model": "cpu_model/config.json", "trainer": {"framework": "fsdp2", "mesh": {"dp": 2}},
            "rollout": {"engine": "vllm", "mesh": {"tp": 2}}, "transport": "gloo"}


def test_generated_cpu_spec_is_committed_as_is_and_validates() -> None:
    async def body(c: Client):
        return [await c.call_tool("generate_spec", CPU_CALL),
                await c.call_tool("validate_spec", {"spec_path": GENERATED.name}),
                await c.call_tool("plan_transfer", {"spec_path": GENERATED.name})]

    draft, valid, plan = run_session(in_process("auto", base_dir=DATA), body)
    text = ok(draft)["yaml"]
    if os.environ.get("WEIGHTBRIDGE_REFRESH_GENERATED") == "1":
        GENERATED.write_text(text)
    assert text == GENERATED.read_text(), "stale: WEIGHTBRIDGE_REFRESH_GENERATED=1 refreshes it"
    assert "config: cpu_model/config.json" in text and "transport: gloo" in text and "network: cpu-gloo" in text
    assert str(DATA) not in text  # no absolute path
    assert ok(valid)["valid"] is True and ok(plan)["network"] == "cpu-gloo"
    resolved, problems = check_spec(GENERATED)  # also from outside the server: the CLI's check
    assert not problems and resolved.sync.transport == "gloo"


def test_model_path_is_relative_to_the_written_spec(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "specs").mkdir()
    shutil.copy(DATA / "cpu_model" / "config.json", tmp_path / "models" / "m" / "config.json")
    call = {**CPU_CALL, "model": "models/m/config.json"}

    async def body(c: Client):
        return [await c.call_tool("generate_spec", {**call, "write_to": "specs/wb.yaml"}),
                await c.call_tool("generate_spec", call),
                await c.call_tool("generate_spec", {**call, "transport": "nccl"}),
                await c.call_tool("generate_spec", {**call, "transport": None, "network": "h200"})]

    written, unwritten, nccl, h200 = map(ok, run_session(in_process("auto", base_dir=tmp_path), body))
    assert "config: ../models/m/config.json" in written["yaml"]
    assert (tmp_path / "specs" / "wb.yaml").read_text() == written["yaml"]
    resolved, problems = check_spec(tmp_path / "specs" / "wb.yaml")  # resolves from the spec's own directory
    assert not problems and resolved.network == "cpu-gloo"
    assert "config: models/m/config.json" in unwritten["yaml"]  # no write_to: relative to the working directory
    assert "network: h100" in nccl["yaml"] and "transport: nccl" in nccl["yaml"]
    assert "network: h200" in h200["yaml"] and "transport:" not in h200["yaml"]
    assert any(a.startswith("sync.transport: auto") for a in h200["assumed"])


def test_generate_spec_states_what_the_presets_assume_about_each_framework() -> None:
    """Issue 33: drafts that validate but are wrong, found only with explain_tensor (Megatron's local
    layer spec, etp = tp, transformers 5's fused experts under FSDP2, SGLang's CPU padding): every such
    assumption is now stated with how to change it; the mesh note no longer says etp is 1."""
    calls = [{"model": "tiny-qwen3-moe-vllm", "trainer": {"framework": "megatron", "mesh": {"tp": 2}},
              "rollout": {"engine": "sglang", "mesh": {"tp": 2}}},
             {"model": "tiny-qwen3-moe-vllm", "trainer": {"framework": "fsdp2", "mesh": {"dp": 2}},
              "rollout": {"engine": "vllm", "mesh": {"tp": 2}}},
             {"model": "tiny-qwen2", "trainer": {"framework": "fsdp2", "mesh": {"dp": 2}},
              "rollout": {"engine": "vllm", "mesh": {"tp": 2}}}]

    async def body(c: Client):
        return [await c.call_tool("generate_spec", call) for call in calls]

    megatron, fsdp2_moe, dense = (ok(r)["assumed"] for r in run_session(in_process("auto", base_dir=DATA), body))
    assert "trainer.mesh: cp, dp, pp, ep not given, so 1 (axes of the megatron preset: tp, cp, dp, pp, ep, etp)" in megatron
    assert any(a.startswith("trainer.mesh.etp: not given, so tp (Megatron's default") for a in megatron)
    assert any(a.startswith("trainer.params.local_spec: false") and "set local_spec: true" in a for a in megatron)
    assert any(a.startswith("trainer.params.moe_grouped_gemm: true") for a in megatron)
    assert any(a.startswith("rollout.params.cpu_pad: false") and 'multiple: "tp * 32"' in a for a in megatron)
    assert any(a.startswith("trainer.params.fused_experts: true") and "fused_experts: false" in a for a in fsdp2_moe)
    assert not any("fused_experts" in a for a in dense)  # stated only for models with experts
    assert all(any(a.startswith("layouts: from the presets") for a in notes) for notes in (megatron, fsdp2_moe, dense))


def test_generate_spec_fits_the_draft_to_probed_ranks_and_pins_them(tmp_path: Path) -> None:
    """generate_spec with trainer.probes: the preset facts that reproduce the observed ranks, pinned.
    The observations here are a local-spec Megatron's layouts (what live Megatron-Core TP 2 holds:
    tests/megatron_trainer/test_megatron_introspect.py fits live ranks the same way); a probe that
    nothing reproduces, a file that is no probe and one outside the roots are refused by argument."""
    import json

    from weightbridge.spec.resolve import check_text

    live_text = ("version: 1\nmodel: {bundled: tiny-llama}\ntrainer: {preset: megatron, mesh: {tp: 2}, params: "
                 "{local_spec: true}}\nrollout: {preset: vllm, mesh: {tp: 2}}\n")
    live, problems = check_text(live_text)
    assert not problems
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({"layout": live.trainer.ranks[r].to_json()}))
    (tmp_path / "rollout0.json").write_text(json.dumps({"layout": live.trainer.ranks[0].to_json()}))
    (tmp_path / "junk.json").write_text("[1, 2")
    base = {"model": "tiny-llama", "trainer": {"framework": "megatron", "mesh": {"tp": 2}},
            "rollout": {"engine": "vllm", "mesh": {"tp": 2}}}

    def with_probes(side: str, probes: dict) -> dict:
        return {**base, side: {**base[side], "probes": probes}}

    async def body(c: Client):
        return [await c.call_tool("generate_spec", with_probes("trainer", {"0": "rank0.json", "1": "rank1.json"})),
                await c.call_tool("generate_spec", with_probes("rollout", {"0": "rollout0.json"})),
                await c.call_tool("generate_spec", with_probes("trainer", {"0": "junk.json"})),
                await c.call_tool("generate_spec", with_probes("trainer", {"0": "/etc/hostname"}))]

    fitted, unfit, junk, outside = run_session(in_process("auto", base_dir=tmp_path, roots=(tmp_path,)), body)
    draft = ok(fitted)
    resolved, problems = check_text(draft["yaml"])
    assert not problems and resolved.spec.trainer.params["local_spec"] is True
    assert resolved.trainer.ranks == live.trainer.ranks and set(resolved.spec.trainer.pins) == {0, 1}
    assert "trainer.params.local_spec: True (reproduces the observed ranks [0, 1])" in draft["assumed"]
    assert "no variant of the vllm preset (none) reproduces the observed layouts" in error_text(unfit, "generate_spec")
    assert error_text(junk, "generate_spec").startswith("Error executing tool generate_spec: trainer.probes[0]: not a probe")
    assert "outside the allowed roots" in error_text(outside, "generate_spec")
