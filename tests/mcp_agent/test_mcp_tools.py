"""Every tool on good and bad input, in process with the SDK's Client, under both protocol versions."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import ALL_TOOLS, FIVE_MISTAKES, MODES, ROOT, TINY, error_text, in_process, ok, run_session

from weightbridge.cli.main import main as cli
from weightbridge.spec.resolve import check_text
from weightbridge.spec.schema import schema_text

QKV0 = "model.layers.0.self_attn.qkv_proj.weight"
TINY_SIDES = {"trainer": {"framework": "fsdp2", "mesh": {"dp": 2}},
              "rollout": {"engine": "vllm", "mesh": {"tp": 2}, "instances": 2}}


def cli_json(*argv: str) -> object:
    out = io.StringIO()
    with redirect_stdout(out):
        cli(list(argv))
    return json.loads(out.getvalue())


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def test_negotiates_version_and_lists_every_tool_with_schemas(mode: str) -> None:
    async def body(c: Client):
        return c.protocol_version, (await c.list_tools()).tools

    version, tools = run_session(in_process(mode), body)
    assert version == MODES[mode]
    assert {t.name for t in tools} == ALL_TOOLS
    for t in tools:
        assert t.description and t.output_schema and t.output_schema["type"] == "object", t.name
    explain = next(t for t in tools if t.name == "explain_tensor")
    assert set(explain.input_schema["required"]) == {"side", "rank", "tensor"}


def test_inspect_validate_plan_explain_match_the_cli(mode: str) -> None:
    async def body(c: Client):
        return [
            await c.call_tool("inspect_model", {"model": "tiny-qwen2"}),
            await c.call_tool("validate_spec", {"spec_path": FIVE_MISTAKES}),
            await c.call_tool("validate_spec", {"spec_path": TINY}),
            await c.call_tool("plan_transfer", {"spec_path": TINY}),
            await c.call_tool("explain_tensor", {"spec_path": TINY, "side": "rollout", "rank": 3, "tensor": QKV0}),
            await c.call_tool("plan_transfer", {"spec_path": TINY, "change_rate": 0.01}),
        ]

    model, bad, good, plan, explain, delta = map(ok, run_session(in_process(mode), body))
    want_delta = cli_json("plan", str(ROOT / TINY), "--json", "--change-rate", "0.01")
    assert {k: delta[k] for k in ("change_rate", "delta_wire_bytes", "predicted_delta_seconds")} == {
        k: want_delta[k] for k in ("change_rate", "delta_wire_bytes", "predicted_delta_seconds")}
    assert 0 < delta["delta_wire_bytes"] < delta["wire_bytes"]
    want_model = cli_json("models", "tiny-qwen2", "--json")
    assert {k: model[k] for k in want_model} == want_model and model["model"] == {"bundled": "tiny-qwen2"}

    want_bad = cli_json("validate", str(ROOT / FIVE_MISTAKES), "--json")
    assert bad["valid"] is False and bad["problems"] == want_bad["problems"]
    assert [p["path"] for p in bad["problems"]] == [
        "$.trainer.mesh.tp", "$.trainer.rules[0].shard[0].axis", "$.rollout.preset", "$.sync.mode", "$.sync.round_bytes"]
    assert good == {"spec": TINY, "valid": True, "problems": [], "summary": good["summary"],
                    "warnings": good["warnings"]} and "trainer 2 ranks, rollout 2 x 2 ranks" in good["summary"]
    assert good["warnings"] == cli_json("validate", str(ROOT / TINY), "--json")["warnings"]
    assert [w.split(":")[0] for w in good["warnings"]] == ["trainer", "rollout"]  # no pins: never checked live

    want_plan = cli_json("plan", str(ROOT / TINY), "--json")
    assert {k: plan[k] for k in want_plan if k != "planning_seconds"} == {
        k: v for k, v in want_plan.items() if k != "planning_seconds"}
    assert set(plan) - set(want_plan) == {"valid", "top_imbalances"}
    assert plan["valid"] is True and plan["top_imbalances"] == []  # tiny: every sender moves the same bytes

    assert explain == cli_json("explain", str(ROOT / TINY), "--side", "rollout", "--rank", "3", "--tensor", QKV0,
                               "--json")
    assert [p["local_box"] for p in explain["tensors"][0]["pieces"]] == [[[0, 32], [0, 64]], [[32, 48], [0, 64]],
                                                                           [[48, 64], [0, 64]]]


def test_plan_lists_top_imbalances_and_takes_spec_text(mode: str) -> None:
    text = (ROOT / "spec/examples/qwen2.5-7b_megatron-tp4pp2dp2_to_vllm-tp2x8.yaml").read_text()

    async def body(c: Client):
        return await c.call_tool("plan_transfer", {"spec_text": text, "network": "h200", "imbalances": 3})

    plan = ok(run_session(in_process(mode), body))
    assert plan["network"] == "h200" and plan["valid"] is True
    top = plan["top_imbalances"]
    assert len(top) == 3 and top == sorted(top, key=lambda e: -e["vs_mean"])
    assert all(e["vs_mean"] > 1 and e["bytes"] > e["mean_bytes"] for e in top)


def test_generate_spec_drafts_a_valid_spec_and_writes_only_inside_roots(mode: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    root = tmp_path / "root"
    outside.mkdir()
    root.mkdir()

    async def body(c: Client):
        return [
            await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "mode": "async",
                                                "write_to": str(root / "wb.yaml")}),
            await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "write_to": str(outside / "wb.yaml")}),
            await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "write_to": "../outside/rel.yaml"}),
            await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "write_to": str(root / "wb.yaml")}),
            await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "write_to": str(root / "wb.yaml"),
                                                "overwrite": True}),
        ]

    results = run_session(in_process(mode, base_dir=root, roots=(root,)), body)
    draft = ok(results[0])
    assert draft["written_to"] == str(root / "wb.yaml")
    resolved, problems = check_text(draft["yaml"])
    assert not problems and resolved.sync.mode == "async" and resolved.rollout.num_instances == 2
    assert "sync.max_staleness: 1 (the trainer may run one version ahead of rollout)" in draft["assumed"]
    assert any(a.startswith("trainer.mesh: tp, cp, dp_replicate not given, so 1") for a in draft["assumed"])
    for r in results[1:3]:
        assert error_text(r, "generate_spec").startswith("Error executing tool generate_spec: write_to: ")
        assert "outside the allowed roots" in error_text(r, "generate_spec")
    assert list(outside.iterdir()) == []
    assert "exists; pass overwrite=true" in error_text(results[3], "generate_spec")
    replaced = ok(results[4])
    assert replaced["written_to"] == str(root / "wb.yaml") and replaced["yaml"] != draft["yaml"]
    assert (root / "wb.yaml").read_text() == replaced["yaml"] and sorted(p.name for p in root.iterdir()) == [".weightbridge-mcp", "wb.yaml"]


def test_read_only_hides_tools_that_write_or_run_code(mode: str) -> None:
    async def body(c: Client):
        tools = {t.name: t for t in (await c.list_tools()).tools}
        call = await c.call_tool("generate_spec", {"model": "tiny-qwen2", **TINY_SIDES, "write_to": "x.yaml"})
        return tools, call

    tools, call = run_session(in_process(mode, read_only=True), body)
    assert set(tools) == ALL_TOOLS - {"probe_layout", "run_conformance"}
    assert "write_to" not in tools["generate_spec"].input_schema["properties"]
    assert error_text(call, "generate_spec").startswith("write_to: unknown argument")


BAD_CALLS = [
    # (tool, arguments, text the error must contain, naming the field or JSON path)
    ("inspect_model", {"model": "tiny-qwen9"}, "model: unknown bundled model 'tiny-qwen9'"),
    ("inspect_model", {"model": "no/such/config.json"}, "model: "),
    ("inspect_model", {"model": "tiny-qwen2", "dtype": "float13"}, "dtype: 'float13' is not one of \"BF16\""),
    ("inspect_model", {}, "model: required"),
    ("generate_spec", {"model": "tiny-qwen2", "trainer": {"framework": "fsdp2", "mesh": {"dp": 2}},
                       "rollout": {"engine": "vllm", "mesh": {"tp": 3}}}, "rollout.mesh.tp: "),
    ("generate_spec", {"model": "tiny-qwen2", "trainer": {"framework": "fsdp2", "mesh": {"ep": 2}},
                       "rollout": {"engine": "vllm"}}, "trainer.mesh.ep: unknown mesh axis 'ep'"),
    ("generate_spec", {"model": "tiny-qwen2", "trainer": {"framework": "deepspeed"}, "rollout": {"engine": "vllm"}},
     'trainer.framework: \'deepspeed\' is not one of "megatron", "fsdp2", "hf"'),
    ("generate_spec", {"model": "tiny-qwen2", "trainer": {"framework": "hf"}, "rollout": {"engine": "vllm", "mesh": {"tp": 0}}},
     "rollout.mesh.tp: 0 is below the minimum of 1"),
    ("generate_spec", {"model": "qwen-99b", "trainer": {"framework": "hf"}, "rollout": {"engine": "vllm"}},
     "model: 'qwen-99b' is neither a file nor a bundled model"),
    ("validate_spec", {"spec_path": "nope.yaml"}, "spec_path: "),
    ("validate_spec", {}, "spec_path: give exactly one of spec_path or spec_text"),
    ("plan_transfer", {"spec_path": FIVE_MISTAKES}, "$.rollout.preset: 'vlm' is not allowed here (did you mean 'vllm'?)"),
    ("plan_transfer", {"spec_path": TINY, "network": "h900"}, 'network: \'h900\' is not one of "h100", "h200", "gb200", "cpu-gloo"'),
    ("plan_transfer", {"spec_path": TINY, "round_bytes": "lots"}, "round_bytes"),
    ("plan_transfer", {"spec_path": TINY, "round_byte": 5}, "round_byte: unknown argument; did you mean 'round_bytes'?"),
    ("explain_tensor", {"spec_path": TINY, "side": "rollout", "rank": 9, "tensor": "*"},
     "rank: 9 is out of range: the rollout has ranks 0..3"),
    ("explain_tensor", {"spec_path": TINY, "side": "rollout", "rank": -1, "tensor": "*"},
     "rank: -1 is below the minimum of 0"),
    ("explain_tensor", {"spec_path": TINY, "side": "sideways", "rank": 0, "tensor": "*"},
     'side: \'sideways\' is not one of "trainer", "rollout"'),
    ("explain_tensor", {"spec_path": TINY, "side": "rollout", "rank": 1, "tensor": QKV0[:-1]},
     f"tensor: no local tensor of rollout rank 1 matches '{QKV0[:-1]}'; did you mean {QKV0}"),
    ("explain_tensor", {"spec_text": "version: 1\nmodel: {bundled: tiny-qwen2}\n", "side": "rollout", "rank": 0,
                        "tensor": "*"}, "<spec_text>:1: $: 'trainer' is required"),
]


@pytest.mark.parametrize(("tool", "args", "expect"), BAD_CALLS, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BAD_CALLS)])
def test_bad_input_is_an_error_naming_the_field(mode: str, tool: str, args: dict, expect: str) -> None:
    async def body(c: Client):
        return await c.call_tool(tool, args)

    assert expect in error_text(run_session(in_process(mode), body), tool)


def test_resources_and_prompt(mode: str) -> None:
    async def body(c: Client):
        listed = [r.uri for r in (await c.list_resources()).resources]
        schema = await c.read_resource("weightbridge://spec/schema/weightbridge.v1.schema.json")
        example = await c.read_resource(f"weightbridge://{TINY}")
        models = await c.read_resource("weightbridge://models/bundled")
        prompt = await c.get_prompt("integrate_framework", {"trainer": "verl (FSDP2)", "rollout": "vllm"})
        return listed, schema, example, models, prompt

    listed, schema, example, models, prompt = run_session(in_process(mode), body)
    examples = sorted(p.name for p in (ROOT / "spec/examples").glob("*.yaml"))
    assert [u.rsplit("/", 1)[1] for u in listed if u.startswith("weightbridge://spec/examples/")] == examples
    assert "weightbridge://spec/README.md" in listed
    assert {f"weightbridge://integration_guides/{p.name}" for p in (ROOT / "integration_guides").glob("*.md")} <= set(listed)
    assert schema.contents[0].text == schema_text()
    assert example.contents[0].text == (ROOT / TINY).read_text()
    assert "tiny-qwen2" in json.loads(models.contents[0].text)
    text = prompt.messages[0].content.text
    assert "`verl (FSDP2)`" in text and "`vllm`" in text and "run_conformance" in text
