"""The server as an MCP host runs it: a subprocess speaking over stdio (both protocol versions)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import ALL_TOOLS, MODES, TINY, error_text, ok, over_stdio, run_session

from mcp_server.server import main, parse_args


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_stdio_session_good_and_bad_calls(mode: str, tmp_path: Path) -> None:
    spec = Path(__file__).resolve().parents[2] / TINY

    async def body(c: Client):
        tools = {t.name for t in (await c.list_tools()).tools}
        calls = {
            "inspect_model": await c.call_tool("inspect_model", {"model": "tiny-llama"}),
            "validate_spec": await c.call_tool("validate_spec", {"spec_path": str(spec)}),
            "plan_transfer": await c.call_tool("plan_transfer", {"spec_path": str(spec)}),
            "explain_tensor": await c.call_tool("explain_tensor", {"spec_path": str(spec), "side": "trainer",
                                                                   "rank": 1, "tensor": "model.norm.weight"}),
            "generate_spec": await c.call_tool("generate_spec", {
                "model": "tiny-qwen2", "trainer": {"framework": "megatron", "mesh": {"tp": 2}},
                "rollout": {"engine": "sglang", "mesh": {"tp": 2}}, "write_to": "wb.yaml"}),
        }
        bad = {
            "inspect_model": await c.call_tool("inspect_model", {"model": "gpt-17"}),
            "validate_spec": await c.call_tool("validate_spec", {"spec_path": "missing.yaml"}),
            "plan_transfer": await c.call_tool("plan_transfer", {"spec_path": str(spec), "receiver_dedup": "maybe"}),
            "explain_tensor": await c.call_tool("explain_tensor", {"spec_path": str(spec), "side": "trainer",
                                                                   "rank": 2, "tensor": "*"}),
            "generate_spec": await c.call_tool("generate_spec", {
                "model": "tiny-qwen2", "trainer": {"framework": "megatron", "mesh": {"tp": 2}},
                "rollout": {"engine": "sglang"}, "write_to": "/tmp/../etc/wb.yaml"}),
            "run_conformance": await c.call_tool("run_conformance", {"tests": ["/"]}),
            "probe_layout": await c.call_tool("probe_layout", {"spec_path": str(spec), "loader": "x"}),
        }
        return c.protocol_version, tools, calls, bad

    # Reads are confined to the roots too: the example spec's directory is one.
    version, tools, calls, bad = run_session(
        over_stdio(mode, "--root", str(tmp_path), "--root", str(spec.parent), "--cwd", str(tmp_path)), body)
    assert version == MODES[mode] and tools == ALL_TOOLS
    out = {name: ok(r) for name, r in calls.items()}
    assert out["inspect_model"]["source"] == "bundled:tiny-llama"
    assert out["validate_spec"]["valid"] is True and out["plan_transfer"]["valid"] is True
    assert out["explain_tensor"]["tensors"][0]["pieces"][0]["canonical"] == "model.norm.weight"
    assert out["generate_spec"]["written_to"] == str(tmp_path / "wb.yaml") and (tmp_path / "wb.yaml").is_file()
    expect = {
        "inspect_model": "model: unknown bundled model 'gpt-17'",
        "validate_spec": f"spec_path: {tmp_path / 'missing.yaml'}: no such file",
        "plan_transfer": 'receiver_dedup: \'maybe\' is not one of "auto", "on", "off"',
        "explain_tensor": "rank: 2 is out of range: the trainer has ranks 0..1",
        "generate_spec": "write_to: /etc/wb.yaml is outside the allowed roots",
        "run_conformance": "tests[0]: / is outside the allowed roots",
        "probe_layout": "loader: 'x' does not match ^[A-Za-z_]",
    }
    assert {name: expect[name] in error_text(r, name) for name, r in bad.items()} == dict.fromkeys(expect, True)


@pytest.mark.slow
def test_stdio_read_only_lists_five_tools() -> None:
    async def body(c: Client):
        return {t.name for t in (await c.list_tools()).tools}

    assert run_session(over_stdio("auto", "--read-only"), body) == ALL_TOOLS - {"probe_layout", "run_conformance"}


def test_console_script_and_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [ep] = [e for e in entry_points(group="console_scripts") if e.name == "weightbridge-mcp"]
    from mcp_server import launch

    assert ep.value == "mcp_server.launch:main" and ep.load() is launch.main  # the SDK-less hint, then main
    with pytest.raises(SystemExit) as exc:
        launch.main(["--help"])
    assert exc.value.code == 0 and "--read-only" in capsys.readouterr().out
    cfg = parse_args(["--root", str(tmp_path), "--root", "/tmp", "--read-only", "--cwd", str(tmp_path)])
    assert cfg.roots == (tmp_path.resolve(), Path("/tmp").resolve()) and cfg.read_only and cfg.base_dir == tmp_path.resolve()
    assert parse_args(["--cwd", str(tmp_path)]).roots == (tmp_path.resolve(),)  # default root: the working directory
    with pytest.raises(SystemExit) as exc:
        parse_args(["--root", str(tmp_path / "missing")])
    assert exc.value.code == 2 and f"{tmp_path / 'missing'}: not a directory" in capsys.readouterr().err
