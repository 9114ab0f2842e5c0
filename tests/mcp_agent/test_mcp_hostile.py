"""Hostile input over stdio: every bad call is an is_error with a short reason, in bounded time, leaking nothing.

One server (``--root ROOT --cwd ROOT``) serves a table of bad calls and hypothesis-generated
ones. Each answer must be an error or a result, never the SDK's bare ``Error executing tool X``
(a crash), never a traceback, bounded in size, and must not contain SECRET: it sits in files
outside the root that files inside it point to (symlinks, a spec's model path, a checkpoint
shard). A cancelled call and one past ``--call-timeout`` leave no worker process running.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")
require("hypothesis", extra="dev", reason="generated bad input")

from anyio.from_thread import BlockingPortal, start_blocking_portal  # noqa: E402 - after the skips above
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mcp import Client  # noqa: E402
from mcp_helpers import ROOT, TINY, over_stdio, run_session  # noqa: E402
from mcp_types import CallToolResult  # noqa: E402

SECRET = "WB-SECRET-4c1f9e0d"
CALL_TIMEOUT_S = 6  # the server's --call-timeout in the table session
CALL_BOUND_S = 45  # no call may take longer (the worker is killed at CALL_TIMEOUT_S)
MAX_ERROR_CHARS = 5_000
MAX_RESULT_CHARS = 200_000
TINY_TEXT = (ROOT / TINY).read_text()
# Valid but slow to plan: a 7B model in 512 KiB rounds (~230k pieces, minutes of planning).
SLOW_TEXT = (ROOT / "spec/examples/qwen2.5-7b_megatron-tp4pp2dp2_to_vllm-tp2x8.yaml").read_text().replace(
    "round_bytes: 1GiB", "round_bytes: 512KiB")
BOMB = "\n".join(
    [f'a: &a ["{"lol" * 3}"' + ', "lol"' * 8 + "]"]
    + [f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi")]
) + "\n"
TOOL_ARGS = {
    "inspect_model": ["model", "dtype"],
    "validate_spec": ["spec_path", "spec_text"],
    "plan_transfer": ["spec_path", "spec_text", "network", "round_bytes", "receiver_dedup", "imbalances"],
    "explain_tensor": ["side", "rank", "tensor", "spec_path", "spec_text"],
    "generate_spec": ["model", "trainer", "rollout", "mode", "round_bytes", "transport", "network", "write_to", "overwrite"],
}


def _safetensors(header: dict[str, Any]) -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob


def make_tree(base: Path) -> Path:
    """ROOT with hostile files, and files holding SECRET outside it; returns the root."""
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.yaml").write_text(f"version: 1\nmodel: {{bundled: {SECRET}}}\ntrainer: {SECRET}\n# {SECRET}\n")
    (outside / "config.json").write_text(json.dumps({"model_type": SECRET, "hidden_size": SECRET}))
    (outside / "shard.safetensors").write_bytes(_safetensors({SECRET: {"dtype": SECRET, "shape": [SECRET]}}))
    (root / "link.yaml").symlink_to(outside / "secret.yaml")
    (root / "link_dir").symlink_to(outside)
    (root / "link_config.json").symlink_to(outside / "config.json")
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../outside/shard.safetensors"}}))
    (root / "abs_index.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": str(outside / "shard.safetensors")}}))
    (root / "points_out.yaml").write_text(TINY_TEXT.replace("bundled: tiny-qwen2", "config: ../outside/config.json"))
    (root / "points_link.yaml").write_text(TINY_TEXT.replace("bundled: tiny-qwen2", "config: link_config.json"))
    (root / "points_shard.yaml").write_text(
        TINY_TEXT.replace("bundled: tiny-qwen2", "safetensors: model.safetensors.index.json"))
    (root / "tiny.yaml").write_text(TINY_TEXT)
    (root / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.yaml").write_bytes("version: 1\n# caf\xe9\n".encode("latin-1"))
    (root / "nul.yaml").write_text("version: 1\x00\n")
    (root / "big.yaml").write_text("# " + "x" * (2 << 20))
    (root / "long_value.yaml").write_text(TINY_TEXT.replace("preset: vllm", "preset: " + "A" * 100_000))
    (root / "deep.yaml").write_text("version: " + "[" * 10_000 + "]" * 10_000 + "\n")
    (root / "bomb.yaml").write_text(BOMB)
    (root / "slow.yaml").write_text(SLOW_TEXT)
    (root / "empty.yaml").write_text("")
    (root / "adir.yaml").mkdir()
    (root / "emptydir").mkdir()
    os.mkfifo(root / "fifo.yaml")
    (root / "loop.yaml").symlink_to(root / "loop.yaml")
    (root / "bad_config.json").write_bytes(b"\xff\xfe{")
    (root / "truncated.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{")
    return root


def _texts(result: CallToolResult) -> str:
    parts = [getattr(c, "text", "") or "" for c in result.content]
    if result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def check_answer(tool: str, result: CallToolResult, seconds: float) -> str:
    """The answer's text, checked: a reasoned error or a result, bounded, no traceback, no SECRET."""
    text = _texts(result)
    assert SECRET not in text, text[:2000]
    assert "Traceback" not in text and 'File "' not in text, text[:2000]
    assert len(text) <= (MAX_ERROR_CHARS if result.is_error else MAX_RESULT_CHARS), f"{len(text)} chars: {text[:500]}"
    assert "A" * 400 not in text and "x" * 400 not in text  # file content only as short excerpts
    assert seconds < CALL_BOUND_S, f"{tool} took {seconds:.1f} s"
    if result.is_error:
        reason = text.removeprefix(f"Error executing tool {tool}").lstrip(": ").strip()
        assert reason, f"{tool}: a bare error without a reason (a crash)"
        assert "could not be processed" not in reason, reason  # an unanticipated exception in the worker
    return text


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingPortal, Client, Path]]:
    """One stdio server for the whole module, driven from sync tests through a blocking portal."""
    root = make_tree(tmp_path_factory.mktemp("hostile"))
    client = over_stdio("auto", "--root", str(root), "--cwd", str(root), "--call-timeout", str(CALL_TIMEOUT_S),
                        "--worker-memory", "1536")
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(client) as c:
        yield portal, c, root


def call(session: tuple[BlockingPortal, Client, Path], tool: str, args: Any) -> tuple[CallToolResult, float]:
    portal, client, _ = session

    async def bounded() -> CallToolResult:
        with anyio.fail_after(CALL_BOUND_S + 15):
            return await client.call_tool(tool, args)

    start = time.monotonic()
    result = portal.call(bounded)
    return result, time.monotonic() - start


SIDES = {"trainer": {"framework": "fsdp2", "mesh": {"dp": 2}}, "rollout": {"engine": "vllm", "mesh": {"tp": 2}}}
EXPLAIN = {"side": "rollout", "rank": 0, "tensor": "*"}
# (tool, arguments, the error must contain one of these; None: a reasoned error, or for validate_spec a
# result with valid=false; ANY: a reasoned error or a result)
ANY = ("*",)
CASES: list[tuple[str, dict[str, Any], tuple[str, ...] | None]] = [
    # reads outside the root, directly or through a file inside it
    ("validate_spec", {"spec_path": "../outside/secret.yaml"}, ("outside the allowed roots",)),
    ("validate_spec", {"spec_path": "link.yaml"}, ("outside the allowed roots",)),
    ("validate_spec", {"spec_path": "link_dir/secret.yaml"}, ("outside the allowed roots",)),
    ("validate_spec", {"spec_path": "/etc/passwd"}, ("outside the allowed roots",)),
    ("validate_spec", {"spec_path": "/dev/zero"}, ("outside the allowed roots",)),
    ("validate_spec", {"spec_path": "/proc/self/environ"}, ("outside the allowed roots",)),
    ("plan_transfer", {"spec_path": "points_out.yaml"}, ("outside the allowed roots",)),
    ("plan_transfer", {"spec_path": "points_link.yaml"}, ("outside the allowed roots",)),
    ("explain_tensor", {**EXPLAIN, "spec_path": "points_shard.yaml"}, ("outside the allowed roots",)),
    ("plan_transfer", {"spec_text": TINY_TEXT.replace("bundled: tiny-qwen2", "config: ../outside/config.json")},
     ("outside the allowed roots",)),
    ("inspect_model", {"model": "../outside/config.json"}, ("outside the allowed roots",)),
    ("inspect_model", {"model": "link_config.json"}, ("outside the allowed roots",)),
    ("inspect_model", {"model": "link_dir"}, ("outside the allowed roots",)),
    ("inspect_model", {"model": "model.safetensors.index.json"}, ("outside the allowed roots",)),
    ("inspect_model", {"model": "abs_index.safetensors.index.json"}, ("outside the allowed roots",)),
    ("generate_spec", {"model": "../outside/config.json", **SIDES}, ("outside the allowed roots",)),
    ("generate_spec", {"model": "link_config.json", **SIDES}, ("outside the allowed roots",)),
    # files that are not specs
    ("validate_spec", {"spec_path": "binary.yaml"}, ("not UTF-8",)),
    ("validate_spec", {"spec_path": "latin1.yaml"}, ("not UTF-8",)),
    ("validate_spec", {"spec_path": "nul.yaml"}, ("NUL",)),
    ("validate_spec", {"spec_path": "big.yaml"}, ("too large",)),
    ("validate_spec", {"spec_path": "adir.yaml"}, ("is a directory",)),
    ("validate_spec", {"spec_path": "fifo.yaml"}, ("not a regular file",)),
    ("validate_spec", {"spec_path": "loop.yaml"}, ("cannot be resolved", "no such file")),
    ("validate_spec", {"spec_path": "missing.yaml"}, ("no such file",)),
    ("validate_spec", {"spec_path": "empty.yaml"}, None),
    ("plan_transfer", {"spec_path": "long_value.yaml"}, None),
    ("plan_transfer", {"spec_path": "deep.yaml"}, None),
    ("plan_transfer", {"spec_path": "bomb.yaml"}, None),
    ("plan_transfer", {"spec_path": "slow.yaml"}, ("call_timeout", "MiB of memory")),  # killed at a limit
    ("inspect_model", {"model": "bad_config.json"}, None),
    ("inspect_model", {"model": "emptydir"}, None),
    ("inspect_model", {"model": "truncated.safetensors"}, None),
    # argument values
    ("validate_spec", {"spec_path": "a\x00b.yaml"}, ("NUL",)),
    ("validate_spec", {"spec_path": "x" * 5000}, ("at most 4096 characters",)),
    ("validate_spec", {"spec_path": "x" * 300}, ("longer than 255 bytes",)),
    ("validate_spec", {"spec_path": ""}, ("spec_path: at least 1 character",)),
    ("validate_spec", {"spec_text": "x" * (2 << 20)}, ("at most 1048576 characters",)),
    ("validate_spec", {"spec_text": "version: 1\x00\n"}, None),
    ("validate_spec", {"spec_text": "version: " + "[" * 10_000 + "]" * 10_000}, None),
    ("validate_spec", {"spec_text": BOMB}, None),
    ("validate_spec", {"spec_path": 5}, ("spec_path",)),
    ("validate_spec", {"spec_path": ["a"]}, ("spec_path",)),
    ("validate_spec", {"spec_path": "tiny.yaml", "spec_text": "version: 1"}, ("exactly one",)),
    ("explain_tensor", {**EXPLAIN, "spec_path": "tiny.yaml", "tensor": "x" * 5000}, ("at most 1000 characters",)),
    ("explain_tensor", {**EXPLAIN, "spec_path": "tiny.yaml", "tensor": "*" * 1000}, ANY),
    ("explain_tensor", {**EXPLAIN, "spec_path": "tiny.yaml", "tensor": "[" * 999}, ANY),
    ("explain_tensor", {**EXPLAIN, "spec_path": "tiny.yaml", "rank": 10**30}, ("rank",)),
    ("plan_transfer", {"spec_path": "tiny.yaml", "round_bytes": "0"}, ("round_bytes: '0' is not a size of at least 4KiB",)),
    ("plan_transfer", {"spec_path": "tiny.yaml", "round_bytes": -5}, ("round_bytes",)),
    ("plan_transfer", {"spec_path": "tiny.yaml", "round_bytes": 10**40}, ANY),
    ("inspect_model", {"model": "x" * 5000}, ("at most 4096 characters",)),
    ("inspect_model", {"model": "tiny-qwen2", "dtype": "d" * 10_000}, ("dtype",)),
    ("generate_spec", {"model": "tiny-qwen2", "trainer": {"framework": "fsdp2", "mesh": {"dp": 10**9}},
                       "rollout": SIDES["rollout"]}, None),
    ("generate_spec", {"model": "tiny-qwen2", **SIDES, "write_to": "adir.yaml"}, ("is a directory",)),
    ("generate_spec", {"model": "tiny-qwen2", **SIDES, "write_to": "nodir/x.yaml"}, ("does not exist",)),
    ("generate_spec", {"model": "tiny-qwen2", **SIDES, "write_to": "../outside/x.yaml"}, ("outside the allowed roots",)),
    ("generate_spec", {"model": "tiny-qwen2", **SIDES, "write_to": "y" * 300}, ("longer than 255 bytes",)),
    ("validate_spec", {"spec_path": "tiny.yaml", "z" * 100_000: 1}, ("unknown argument",)),
    ("no_such_tool", {}, None),
]


@pytest.mark.slow
def test_table_of_bad_calls(session: tuple[BlockingPortal, Client, Path]) -> None:
    """Each case, one after another on one server: reasoned error, bounded time and size, no SECRET."""
    failures = []
    for i, (tool, args, expect) in enumerate(CASES):
        result, seconds = call(session, tool, args)
        try:
            text = check_answer(tool, result, seconds)
            if expect is ANY:
                continue
            invalid = tool == "validate_spec" and not result.is_error and result.structured_content["valid"] is False
            assert result.is_error or (expect is None and invalid), f"expected an error, got {text[:300]}"
            if expect is not None:
                assert any(e in text for e in expect), f"expected one of {expect}: {text[:600]}"
        except AssertionError as exc:
            failures.append(f"case {i} {tool} {str(args)[:100]}: {exc}")
    assert not failures, "\n".join(failures)
    result, _ = call(session, "validate_spec", {"spec_path": "tiny.yaml"})  # the server still works
    assert not result.is_error and result.structured_content["valid"] is True


def _spec_mutation() -> st.SearchStrategy[str]:
    """TINY's text with one stretch replaced by generated text."""
    lines = TINY_TEXT.splitlines()
    return st.builds(
        lambda i, junk: "\n".join(lines[:i] + [junk] + lines[i + 1:]),
        st.integers(0, len(lines) - 1),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
PATHS = st.sampled_from(["tiny.yaml", "link.yaml", "../outside/secret.yaml", "points_out.yaml", "binary.yaml",
                         "adir.yaml", "fifo.yaml", "loop.yaml", "/etc/passwd", "link_dir", "~", ".", "..", "nul.yaml",
                         "model.safetensors.index.json", "tiny-qwen2"])


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    tool = draw(st.sampled_from(sorted(TOOL_ARGS)))
    names = draw(st.lists(st.sampled_from(TOOL_ARGS[tool]), unique=True, max_size=4))
    args: dict[str, Any] = {}
    for name in names:
        if name in ("spec_path", "model", "write_to"):
            args[name] = draw(PATHS | JSON_VALUES)
        elif name == "spec_text":
            args[name] = draw(_spec_mutation() | JSON_VALUES)
        else:
            args[name] = draw(JSON_VALUES)
    return tool, args


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(tool_calls())
def test_generated_calls_are_answered_with_a_reason(session: tuple[BlockingPortal, Client, Path],
                                                    tool_call: tuple[str, dict[str, Any]]) -> None:
    tool, args = tool_call
    result, seconds = call(session, tool, args)
    check_answer(tool, result, seconds)


# ---- cancellation and the call limit stop the work ------------------------------------------------------


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _procs() -> dict[int, tuple[int, str, float, str]]:
    """pid -> (parent pid, state, CPU seconds, command line) of every process (from /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(entry)] = (int(stat[1]), stat[0], (int(stat[11]) + int(stat[12])) * TICK_S, cmd)
    return out


def _server_tree(root: Path) -> tuple[dict[int, float], list[int]]:
    """({pid: CPU seconds} of the server started for ``root`` and its zygote, the running worker pids)."""
    procs = _procs()
    servers = [pid for pid, (_, _, _, cmd) in procs.items() if "mcp_server.server" in cmd and str(root) in cmd]
    assert servers, "the stdio server process was not found"
    zygotes = [pid for pid, (ppid, _, _, cmd) in procs.items() if ppid in servers and "mcp_server.worker" in cmd]
    workers = [pid for pid, (ppid, state, _, _) in procs.items() if ppid in zygotes and state != "Z"]
    return {pid: procs[pid][2] for pid in servers + zygotes}, workers


def _cpu_seconds(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) * TICK_S


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _no_workers_and_idle(root: Path, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        _, workers = _server_tree(root)
        if not workers:
            break
        assert time.monotonic() < deadline, f"workers still running: {workers}"
        time.sleep(0.1)
    before, _ = _server_tree(root)
    time.sleep(1.5)
    after, workers = _server_tree(root)
    used = sum(after.values()) - sum(before.values())
    assert not workers and used < 0.5, f"the server used {used:.2f} s of CPU in 1.5 s after the call ended"


LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")


@pytest.mark.slow
@LINUX_PROC
def test_cancelled_call_kills_its_worker_and_cpu_use_stops(tmp_path: Path) -> None:
    root = make_tree(tmp_path)

    async def body(c: Client):
        seen: list[int] = []
        with anyio.move_on_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.call_tool, "plan_transfer", {"spec_path": "slow.yaml"})
                while True:  # the worker is planning (using CPU)
                    _, workers = _server_tree(root)
                    busy = [w for w in workers if _cpu_seconds(w) > 0.5]
                    if busy:
                        seen.extend(busy)
                        break
                    await anyio.sleep(0.2)
                tg.cancel_scope.cancel()  # the client gives up: notifications/cancelled
        assert seen, "no worker was seen planning"
        await anyio.to_thread.run_sync(_no_workers_and_idle, root)
        assert not any(_running(pid) for pid in seen)
        return await c.call_tool("validate_spec", {"spec_path": "tiny.yaml"})  # and the server still answers

    after = run_session(over_stdio("auto", "--root", str(root), "--cwd", str(root), "--call-timeout", "600"), body)
    assert not after.is_error and after.structured_content["valid"] is True


@pytest.mark.slow
@LINUX_PROC
def test_call_past_the_limit_is_an_error_and_its_worker_is_gone(tmp_path: Path) -> None:
    root = make_tree(tmp_path)

    async def body(c: Client):
        # a first call starts the server's zygote (imports; 20+ s on a loaded 2-core machine, CI 41): the
        # limit is the worker's, so the timed call is the second
        warm = await c.call_tool("validate_spec", {"spec_path": "tiny.yaml"})
        assert not warm.is_error
        start = time.monotonic()
        result = await c.call_tool("plan_transfer", {"spec_path": "slow.yaml"})
        seconds = time.monotonic() - start
        await anyio.to_thread.run_sync(_no_workers_and_idle, root)
        return result, seconds

    result, seconds = run_session(over_stdio("auto", "--root", str(root), "--cwd", str(root), "--call-timeout", "3"), body)
    text = check_answer("plan_transfer", result, seconds)
    assert result.is_error and "call_timeout: the call did not finish within 3 s" in text
    assert seconds < 20
