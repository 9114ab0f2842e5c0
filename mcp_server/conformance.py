"""Tool ``run_conformance``: run pytest on test modules inside the server's roots, bounded, with progress.

Arguments are structured (test paths / node ids, a keyword expression, a marker
expression) and checked; nothing is passed to pytest as a raw flag. pytest runs in a
subprocess in its own process group (see :mod:`mcp_server.subproc`), writes a junit XML
that is parsed into counts and the first failures, and reports progress through a tiny
plugin (:mod:`mcp_server._pytest_progress`). weightbridge's conformance plugin
(``weightbridge.testing``, a pytest11 entry point) is active in that pytest like in any other.
"""


import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

from mcp_server.roots import ServerConfig, fail
from mcp_server.subproc import run_group

# A keyword / marker expression: names, spaces, parentheses, and/or/not; brackets, dots, dashes
# inside names (test ids); never starting with '-' so it cannot become a flag.
_EXPR = re.compile(r"^(?!-)[A-Za-z0-9_ ()\[\].\-]+$")
_NODE = re.compile(r"^(?!-)[^\x00\n]+$")
FAILURE_TEXT_LIMIT = 4000
USAGE_EXITS = {3: "internal error", 4: "usage error"}  # pytest's exit codes that carry no test results


class Counts(BaseModel):
    tests: int
    passed: int
    failed: int
    errors: int
    skipped: int


class Failure(BaseModel):
    test: str = Field(description="Test id (junit classname::name)")
    kind: str = Field(description="failure or error")
    message: str
    details: str = Field(description="The end of the failure report (assertion, captured output)")


class ConformanceResult(BaseModel):
    """Outcome of one pytest run: counts from its junit XML and the first failures."""

    passed: bool = Field(description="pytest exited 0 (every selected test passed or was skipped)")
    exit_code: int
    counts: Counts
    failures: list[Failure]
    seconds: float
    command: list[str] = Field(description="The pytest arguments that were run (after python -m pytest)")
    output_tail: str = Field(description="Last lines of pytest's output")
    requirements: dict[str, str] = Field(
        default_factory=dict,
        description="weightbridge conformance requirement id -> passed / failed / error / skipped (xfail: a "
        "declared known gap), from the junit property the conformance plugin sets; empty for other tests",
    )


def _test_args(config: ServerConfig, tests: list[str]) -> list[str]:
    out = []
    for i, test in enumerate(tests):
        arg = f"tests[{i}]"
        if not _NODE.match(test):
            raise fail(arg, f"{test!r} is not a test path or node id (it must not start with '-')")
        file_part, sep, rest = test.partition("::")
        path = config.inside_roots(file_part, arg)
        if not path.exists():
            raise fail(arg, f"{path}: no such file or directory")
        out.append(str(path) + sep + rest)
    return out


def _requirements(root: ET.Element) -> dict[str, str]:
    """Outcome per conformance requirement id (the ``requirement`` property of each testcase)."""
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        req = next((p.get("value") for p in case.iter("property") if p.get("name") == "requirement"), None)
        if req:
            kind = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
            out[req] = {"failure": "failed"}.get(kind, kind)
    return out


def _parse_junit(path: Path, limit: int) -> tuple[Counts, list[Failure], dict[str, str]]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failures: list[Failure] = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None and len(failures) < limit:
                text = (el.text or "").strip()
                failures.append(Failure(
                    test=f"{case.get('classname', '')}::{case.get('name', '')}",
                    kind=kind,
                    message=(el.get("message") or "").strip()[:FAILURE_TEXT_LIMIT],
                    details=text[-FAILURE_TEXT_LIMIT:],
                ))
    passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    return Counts(tests=tot["tests"], passed=passed, failed=tot["failures"], errors=tot["errors"],
                  skipped=tot["skipped"]), failures, _requirements(root)


def _progress(path: Path) -> tuple[int | None, int, str]:
    """(collected or None, finished tests, last finished line) from the progress file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None, 0, ""
    total = next((int(x.split()[1]) for x in lines if x.startswith("collected ")), None)
    done = [x for x in lines if not x.startswith("collected ")]
    return total, len(done), done[-1] if done else ""


def register(server: MCPServer, config: ServerConfig) -> None:
    @server.tool(title="Run conformance tests")
    async def run_conformance(
        tests: Annotated[
            list[str],
            Field(min_length=1, max_length=64, description="Test files, directories or node ids "
                  "(path::Class::test), inside the server's roots; relative to its working directory."),
        ],
        ctx: Context,
        keyword: Annotated[
            str | None, Field(max_length=500, description="pytest -k expression, e.g. 'sync and not slow'.")
        ] = None,
        markers: Annotated[str | None, Field(max_length=500, description="pytest -m expression, e.g. 'not slow'.")] = None,
        timeout_s: Annotated[int, Field(ge=1, description="Wall-clock limit; the run is killed after it.")] = 600,
        max_failures: Annotated[int, Field(ge=0, le=50, description="How many failures to report in full.")] = 5,
    ) -> ConformanceResult:
        """Run pytest on the given test modules (e.g. an integration's conformance suite) and report the results.

        pytest runs in a subprocess (own process group, killed with everything it spawned at
        timeout_s), with progress notifications per finished test. Returns counts and the first
        failures from its junit XML. Only structured arguments: test paths, -k and -m expressions.
        """
        config.check_timeout(timeout_s)
        for name, expr in (("keyword", keyword), ("markers", markers)):
            if expr is not None and not _EXPR.match(expr):
                raise fail(name, f"{expr!r} is not a pytest expression (letters, digits, _ . - [ ] ( ), spaces; "
                           "not starting with '-')")
        args = _test_args(config, tests)
        with tempfile.TemporaryDirectory(prefix="wb-conformance-") as tmp:
            junit, progress = Path(tmp) / "junit.xml", Path(tmp) / "progress"
            argv = ["-p", "mcp_server._pytest_progress", "-p", "no:cacheprovider", "-q", "-rfE",
                    f"--junitxml={junit}", "-o", "junit_family=xunit2", *args]
            if keyword is not None:
                argv += ["-k", keyword]
            if markers is not None:
                argv += ["-m", markers]
            # A session of its own: not an xdist worker's (or a running test's) when the server itself
            # runs under pytest (plugins such as pytest-benchmark then warn or change behaviour).
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("PYTEST_XDIST_") and k not in ("PYTEST_CURRENT_TEST", "PYTEST_VERSION")}
            env.update(WEIGHTBRIDGE_MCP_PROGRESS=str(progress), PYTHONDONTWRITEBYTECODE="1")
            reported: list[tuple[int | None, int]] = [(None, 0)]

            async def tick(elapsed: float) -> None:
                total, done, last = _progress(progress)
                if (total, done) != reported[0]:
                    reported[0] = (total, done)
                    await ctx.report_progress(done, total, last or f"collected {total} test(s) in {elapsed:.1f} s")

            await ctx.report_progress(0, None, "starting pytest")
            fin = await run_group([sys.executable, "-m", "pytest", *argv], cwd=config.base_dir, timeout_s=timeout_s,
                                  env=env, on_tick=tick)
            total, done, _ = _progress(progress)
            if fin.timed_out:
                raise fail("timeout_s", f"pytest did not finish within {timeout_s} s; its process group was killed "
                           f"after {done} of {total if total is not None else '?'} test(s) finished")
            if fin.returncode in USAGE_EXITS or not junit.is_file():
                text = "\n".join((fin.stderr + fin.stdout).strip().splitlines()[-15:])
                argument = next((a for flag, a in (("'-k'", "keyword"), ("'-m'", "markers")) if flag in text), "tests")
                raise fail(argument, f"pytest exited {fin.returncode} ({USAGE_EXITS.get(fin.returncode, 'no results')}):\n{text}")
            counts, failures, requirements = _parse_junit(junit, max_failures)
        await ctx.report_progress(done, total, f"finished: {counts.passed} passed, {counts.failed} failed")
        return ConformanceResult(
            passed=fin.returncode == 0,
            exit_code=fin.returncode if fin.returncode is not None else -1,
            counts=counts,
            failures=failures,
            seconds=round(fin.seconds, 3),
            command=[a for a in argv if not a.startswith("--junitxml=")],
            output_tail="\n".join(fin.stdout.strip().splitlines()[-20:]),
            requirements=requirements,
        )
