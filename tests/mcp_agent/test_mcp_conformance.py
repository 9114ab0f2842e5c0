"""run_conformance: pytest in its own process group, junit-parsed results, progress, deadline, argument checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from weightbridge.testing._internal.optional import require

require("mcp.server.mcpserver", extra="mcp", reason="the MCP server needs the MCP SDK")

from mcp import Client  # noqa: E402 - after the skip above
from mcp_helpers import MODES, error_text, in_process, ok, run_session

SUITE = '''
import time
import anyio
import pytest

def test_push_lands():
    time.sleep(0.5)  # long enough for the server to report progress between tests

@pytest.mark.parametrize("n", [1, 2])
def test_versions(n):
    time.sleep(0.5)
    assert n == 1, f"version {n} went backwards"

@pytest.mark.skip(reason="not applicable")
def test_skipped():
    pass

@pytest.mark.xfail(strict=True, reason="known gap: what a conformance suite's known_gaps declare")
def test_gap():
    assert False
'''
NODES = ["test_push_lands", "test_versions[1]", "test_versions[2]", "test_skipped", "test_gap"]

HANGS = '''
import os, subprocess, sys, time
from pathlib import Path

def test_hangs():
    here = Path(__file__).parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (here / "pids").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(120)
'''


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def assert_dead(*pids: int) -> None:
    """Every pid stops running within 10 s (SIGTERM, then SIGKILL after the server's grace period)."""
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if _alive(pid)] == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_runs_a_user_module_and_reports_counts_failures_and_progress(mode: str, tmp_path: Path) -> None:
    (tmp_path / "test_my_integration.py").write_text(SUITE)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def body(c: Client):
        return await c.call_tool("run_conformance", {"tests": ["test_my_integration.py"], "timeout_s": 120},
                                 progress_callback=on_progress)

    res = ok(run_session(in_process(mode, base_dir=tmp_path), body))
    assert res["passed"] is False and res["exit_code"] == 1
    assert res["counts"] == {"tests": 5, "passed": 2, "failed": 1, "errors": 0, "skipped": 1, "xfailed": 1}
    [failure] = res["failures"]
    assert failure["test"] == "test_my_integration::test_versions[2]" and failure["kind"] == "failure"
    assert "version 2 went backwards" in failure["message"]
    assert (5, 5, "finished: 2 passed, 1 failed, 1 xfailed") == progress[-1]
    during = progress[1:-1]  # between "starting pytest" and "finished"
    assert progress[0] == (0, None, "starting pytest")
    assert during[0][:2] == (0, 5) and during[0][2].startswith("collected 5 test(s) in ")
    # one notification per finished test, numbered 1..5, none left out however fast they finish
    finished = [(done, msg) for done, _, msg in during[1:]]
    assert [done for done, _ in finished] == [1, 2, 3, 4, 5] and all(total == 5 for _, total, _ in during)
    assert sorted(msg for _, msg in finished) == sorted(
        f"{outcome} test_my_integration.py::{node}" for outcome, node in
        zip(("passed", "passed", "failed", "skipped", "xfailed"), NODES))
    assert not any(a.startswith("-") and a not in ("-p", "-q", "-rfE", "-o") for a in res["command"])


@pytest.mark.slow
def test_keyword_and_marker_select_tests(tmp_path: Path) -> None:
    (tmp_path / "test_my_integration.py").write_text(SUITE)

    async def body(c: Client):
        return await c.call_tool("run_conformance", {"tests": [str(tmp_path)], "keyword": "versions and not 2",
                                                     "markers": "not slow"})

    res = ok(run_session(in_process("auto", base_dir=tmp_path), body))
    assert res["passed"] is True
    assert res["counts"] == {"tests": 1, "passed": 1, "failed": 0, "errors": 0, "skipped": 0, "xfailed": 0}


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)

    async def body(c: Client):
        return await c.call_tool("run_conformance", {"tests": ["test_hangs.py"], "timeout_s": 8})

    start = time.monotonic()
    text = error_text(run_session(in_process("legacy", base_dir=tmp_path), body), "run_conformance")
    assert time.monotonic() - start < 30
    assert "timeout_s: pytest did not finish within 8 s; its process group was killed after 0 of 1" in text
    assert_dead(*map(int, (tmp_path / "pids").read_text().split()))


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_cancelled_call_kills_the_whole_process_group(mode: str, tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)

    async def body(c: Client):
        with anyio.move_on_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.call_tool, "run_conformance", {"tests": ["test_hangs.py"], "timeout_s": 600})
                while not (tmp_path / "pids").is_file():  # the test is running: both processes exist
                    await anyio.sleep(0.1)
                tg.cancel_scope.cancel()  # the client gives up on the call

    run_session(in_process(mode, base_dir=tmp_path), body)
    assert_dead(*map(int, (tmp_path / "pids").read_text().split()))


BAD = [
    ({"tests": ["/etc"]}, "tests[0]: /etc is outside the allowed roots"),
    ({"tests": ["../elsewhere/test_x.py"]}, "tests[0]: "),
    ({"tests": ["--co"]}, "tests[0]: '--co' does not match ^[^\\x00\\n-]"),
    ({"tests": ["test_missing.py"]}, "tests[0]: "),
    ({"tests": []}, "tests: 0 item(s); at least 1"),
    ({"tests": ["test_ok.py"], "keyword": "-p evil"}, "keyword: '-p evil' does not match ^[A-Za-z0-9_ ()"),
    ({"tests": ["test_ok.py"], "markers": "slow; rm -rf"}, "markers: 'slow; rm -rf' does not match ^[A-Za-z0-9_ ()"),
    ({"tests": ["test_ok.py"], "timeout_s": 100000}, "timeout_s: 100000 is above the maximum of 1800"),
    ({"tests": ["test_ok.py"], "timeout_s": 0}, "timeout_s: 0 is below the minimum of 1"),
    ({"tests": ["test_ok.py"], "args": ["-x"]}, "args: unknown argument"),
    ({"tests": ["test_ok.py"], "basetemp": "."}, "basetemp: "),  # pytest would remove the root
    ({"tests": ["test_ok.py"], "basetemp": "sub/.."}, "holds"),
    ({"tests": ["test_ok.py"], "basetemp": "/tmp/wb-bt"}, "basetemp: /tmp/wb-bt is outside the allowed roots"),
    ({"tests": ["test_ok.py"], "wb_report": "test_ok.py"}, "wb_report: "),  # exists; no overwrite
    ({"tests": ["test_ok.py"], "wb_report": "/etc/wb.json"}, "wb_report: /etc/wb.json is outside the allowed roots"),
]


@pytest.mark.parametrize(("args", "expect"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_arguments_never_reach_pytest(tmp_path: Path, args: dict, expect: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "test_ok.py").write_text("def test_ok():\n    pass\n")

    async def body(c: Client):
        return await c.call_tool("run_conformance", args)

    assert expect in error_text(run_session(in_process("auto", base_dir=root), body), "run_conformance")
    assert sorted(os.listdir(root)) == ["test_ok.py"]  # nothing ran: no cache, no junit


def test_a_usage_error_of_pytest_names_the_argument(tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")

    async def body(c: Client):
        return await c.call_tool("run_conformance", {"tests": ["test_ok.py"], "keyword": "and and"})

    text = error_text(run_session(in_process("auto", base_dir=tmp_path), body), "run_conformance")
    assert "keyword: pytest exited 4 (usage error):\nERROR: Wrong expression passed to '-k': and and" in text


def test_a_basetemp_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")

    async def body(c: Client):
        return await c.call_tool("run_conformance", {"tests": ["test_ok.py"], "basetemp": "keep"})

    text = error_text(run_session(in_process("auto", base_dir=tmp_path), body), "run_conformance")
    assert "basetemp: " in text and "is not empty" in text
    assert (tmp_path / "keep" / "notes.txt").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_runs_the_conformance_plugin_on_an_integration_and_reports_requirements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin (pytest11) is active in run_conformance's pytest: an out-of-tree integration's suite
    reports its requirement ids; a declared known gap (a real failure: TOYRL_BREAK=fused-order breaks the
    loader) is xfailed, as pytest and --wb-report say, never skipped; --basetemp and --wb-report pass through."""
    import json
    import shutil

    example = Path(__file__).resolve().parents[2] / "examples" / "toy_integration"
    shutil.copytree(example, tmp_path / "toy", ignore=shutil.ignore_patterns("__pycache__"))
    suite = tmp_path / "toy" / "test_toyrl_conformance.py"
    suite.write_text(suite.read_text().replace(
        "    startup_s = 10.0", "    known_gaps = {\"layout.rollout.probe-agrees\": \"its loader fuses [up; gate]\"}\n"
        "    startup_s = 10.0"))
    monkeypatch.setenv("TOYRL_BREAK", "fused-order")  # the server's environment, passed to pytest

    async def body(c: Client):
        return await c.call_tool("run_conformance", {
            "tests": ["toy"], "keyword": "validates_and_resolves or covers_every or rollout_loader", "timeout_s": 300,
            "basetemp": "bt", "wb_report": "wb.json"})

    res = ok(run_session(in_process("auto", base_dir=tmp_path), body))
    assert res["passed"] is True, res["output_tail"]
    assert res["requirements"] == {
        "spec.resolve.clean": "passed", "layout.cover.exact": "passed", "layout.rollout.probe-agrees": "xfailed"}
    assert res["counts"]["xfailed"] == 1 and res["counts"]["skipped"] == 0
    report = json.loads((tmp_path / "wb.json").read_text())["requirements"]
    assert {k: v["outcome"] for k, v in report.items()} == res["requirements"]
    assert res["wb_report"] == str(tmp_path / "wb.json") and res["basetemp"] == str(tmp_path / "bt")
    assert ["--basetemp", str(tmp_path / "bt")] == res["command"][res["command"].index("--basetemp"):][:2]
    assert (tmp_path / "bt").is_dir()
