"""Tool ``run_conformance``: run pytest on test modules inside the server's roots, bounded, with progress.

Arguments are structured (test paths / node ids, a keyword expression, a marker expression, a
``--basetemp`` directory and a ``--wb-report`` file inside the roots) and declared exactly by the
tool's input schema; nothing is passed to pytest as a raw flag. pytest runs in a subprocess in its
own process group (see :mod:`mcp_server.subproc`) with its temporary files inside the roots
(:mod:`mcp_server.scratch`), writes a junit XML that is parsed into counts (a declared known gap
is ``xfailed``, as pytest and ``--wb-report`` say, never ``skipped``) and the first failures, and
reports every finished test as a progress notification through a tiny plugin
(:mod:`mcp_server._pytest_progress`). weightbridge's conformance plugin (``weightbridge.testing``,
a pytest11 entry point) is active in that pytest like in any other.
"""


import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from mcp_server import scratch
from mcp_server.declared import ToolSet
from mcp_server.roots import MAX_PATH_CHARS, ServerConfig, fail, short_path
from mcp_server.subproc import run_group

# A keyword / marker expression: names, spaces, parentheses, and/or/not; brackets, dots, dashes
# inside names (test ids); never starting with '-' so it cannot become a flag. Declared as the
# arguments' patterns (no look-ahead: JSON Schema and pydantic's regex engine read them alike).
EXPR_PATTERN = r"^[A-Za-z0-9_ ()\[\].][A-Za-z0-9_ ()\[\].\-]*$"
NODE_PATTERN = r"^[^\x00\n-][^\x00\n]*$"
FAILURE_TEXT_LIMIT = 4000
USAGE_EXITS = {3: "internal error", 4: "usage error"}  # pytest's exit codes that carry no test results
DEFAULT_TIMEOUT_S = 1800  # above the SGLang conformance suite's ~12 minutes on a 2-core machine
BASETEMP_MARK = ".weightbridge-basetemp"  # written into a --basetemp after the run: it may be reused


class Counts(BaseModel):
    tests: int
    passed: int
    failed: int
    errors: int
    skipped: int = Field(description="Skipped tests (a declared known gap is xfailed, not skipped)")
    xfailed: int = Field(description="Expected failures: the declared known gaps of a conformance suite")


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
        description="weightbridge conformance requirement id -> passed / failed / error / skipped / xfailed (a "
        "declared known gap), from the junit property the conformance plugin sets; empty for other tests",
    )
    wb_report: str | None = Field(default=None, description="The --wb-report file written, when wb_report was given")
    basetemp: str | None = Field(default=None, description="pytest's --basetemp, when basetemp was given")


def _test_args(config: ServerConfig, tests: list[str]) -> list[str]:
    out = []
    for i, test in enumerate(tests):
        arg = f"tests[{i}]"  # the form (NODE_PATTERN) is declared; where it points is checked here
        file_part, sep, rest = test.partition("::")
        path = config.inside_roots(file_part, arg)
        if not path.exists():
            raise fail(arg, f"{path}: no such file or directory")
        out.append(str(path) + sep + rest)
    return out


def _outcome(case: ET.Element) -> str:
    """passed / failed / error / skipped / xfailed of one junit testcase (pytest writes an xfail as a
    ``<skipped type="pytest.xfail">``)."""
    for kind, name in (("failure", "failed"), ("error", "error")):
        if case.find(kind) is not None:
            return name
    skipped = case.find("skipped")
    if skipped is None:
        return "passed"
    return "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"


def _requirements(root: ET.Element) -> dict[str, str]:
    """Outcome per conformance requirement id (the ``requirement`` property of each testcase)."""
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        req = next((p.get("value") for p in case.iter("property") if p.get("name") == "requirement"), None)
        if req:
            out[req] = _outcome(case)
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
    xfailed = sum(1 for case in root.iter("testcase") if _outcome(case) == "xfailed")
    passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    return Counts(tests=tot["tests"], passed=passed, failed=tot["failures"], errors=tot["errors"],
                  skipped=tot["skipped"] - xfailed, xfailed=xfailed), failures, _requirements(root)


def _progress(path: Path) -> tuple[int | None, list[str]]:
    """(collected or None, one ``OUTCOME nodeid`` line per finished test) from the progress file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None, []
    total = next((int(x.split()[1]) for x in lines if x.startswith("collected ")), None)
    return total, [x for x in lines if x and not x.startswith("collected ")]


def _basetemp(config: ServerConfig, raw: str, tests: list[str]) -> Path:
    """``basetemp`` resolved: inside the roots, holding none of the roots, the working directory, the state
    directory or a test; new, empty, or a basetemp of an earlier run (pytest removes it before the run)."""
    path = config.inside_roots(raw, "basetemp")
    keep = [*config.roots, config.base_dir, config.state_dir, *(config.resolve(t.partition("::")[0]) for t in tests)]
    for other in keep:
        if other is not None and (other == path or other.is_relative_to(path)):
            raise fail("basetemp", f"{short_path(path)} holds {short_path(other)}; pytest removes its --basetemp "
                       "before the run: give a directory of its own")
    if path.exists() and not path.is_dir():
        raise fail("basetemp", f"{short_path(path)} is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / BASETEMP_MARK).is_file():
        raise fail("basetemp", f"{short_path(path)} is not empty and no earlier run_conformance used it as its "
                   "basetemp (pytest would remove it): give a new directory")
    if not path.parent.is_dir():
        raise fail("basetemp", f"directory {short_path(path.parent)} does not exist")
    return path


def register(tools: ToolSet, config: ServerConfig) -> None:
    Expr = Annotated[str | None, Field(max_length=500, pattern=EXPR_PATTERN)]
    Place = Annotated[str | None, Field(min_length=1, max_length=MAX_PATH_CHARS)]

    @tools.tool(title="Run conformance tests")
    async def run_conformance(
        tests: Annotated[
            list[Annotated[str, Field(max_length=2 * MAX_PATH_CHARS, pattern=NODE_PATTERN)]],
            Field(min_length=1, max_length=64, description="Test files, directories or node ids "
                  "(path::Class::test), inside the server's roots; relative to its working directory."),
        ],
        ctx: Context,
        keyword: Annotated[Expr, Field(description="pytest -k expression, e.g. 'sync and not slow'.")] = None,
        markers: Annotated[Expr, Field(description="pytest -m expression, e.g. 'not slow'.")] = None,
        timeout_s: Annotated[int, Field(ge=1, le=config.max_timeout_s, description="Wall-clock limit; the run is "
                                        "killed after it (at most the server's --max-timeout).")]
        = min(DEFAULT_TIMEOUT_S, config.max_timeout_s),
        max_failures: Annotated[int, Field(ge=0, le=50, description="How many failures to report in full.")] = 5,
        basetemp: Annotated[Place, Field(description="pytest --basetemp: a directory inside the roots for the tests' "
                                         "tmp_path (new, empty, or an earlier run's: pytest removes it first). "
                                         "Default: a directory removed after the run.")] = None,
        wb_report: Annotated[Place, Field(description="pytest --wb-report: write the conformance outcome of every "
                                          "requirement as JSON to this file (inside the roots).")] = None,
        overwrite: Annotated[bool, Field(description="Replace wb_report if it exists.")] = False,
    ) -> ConformanceResult:
        """Run pytest on the given test modules (e.g. an integration's conformance suite) and report the results.

        pytest runs in a subprocess (own process group, killed with everything it spawned at
        timeout_s), with a progress notification for every finished test. Returns counts (a declared
        known gap is xfailed) and the first failures from its junit XML. Only structured arguments:
        test paths, -k and -m expressions, a --basetemp directory and a --wb-report file.
        """
        args = _test_args(config, tests)
        report = config.writable(wb_report, "wb_report", overwrite=overwrite) if wb_report is not None else None
        base = _basetemp(config, basetemp, tests) if basetemp is not None else None
        with scratch.call_dir(config, "wb-conformance-") as tmp:
            junit, progress = Path(tmp) / "junit.xml", Path(tmp) / "progress"
            argv = ["-p", "mcp_server._pytest_progress", "-p", "no:cacheprovider", "-q", "-rfE",
                    f"--junitxml={junit}", "-o", "junit_family=xunit2", *args]
            for flag, value in (("-k", keyword), ("-m", markers), ("--basetemp", base), ("--wb-report", report)):
                if value is not None:
                    argv += [flag, str(value)]
            # A session of its own: not an xdist worker's (or a running test's) when the server itself
            # runs under pytest (plugins such as pytest-benchmark then warn or change behaviour).
            env = {k: v for k, v in scratch.child_env(config, Path(tmp)).items()
                   if not k.startswith("PYTEST_XDIST_") and k not in ("PYTEST_CURRENT_TEST", "PYTEST_VERSION")}
            env.update(WEIGHTBRIDGE_MCP_PROGRESS=str(progress), PYTHONDONTWRITEBYTECODE="1")
            sent = [0, -1]  # finished tests reported, the collected count reported (-1: not yet)

            async def tick(elapsed: float) -> None:
                total, done = _progress(progress)
                if total is not None and sent[1] != total:
                    sent[1] = total
                    await ctx.report_progress(0, total, f"collected {total} test(s) in {elapsed:.1f} s")
                for line in done[sent[0]:]:  # one notification per finished test, none left out
                    sent[0] += 1
                    await ctx.report_progress(sent[0], total, line)

            await ctx.report_progress(0, None, "starting pytest")
            fin = await run_group([sys.executable, "-m", "pytest", *argv], cwd=config.base_dir, timeout_s=timeout_s,
                                  env=env, on_tick=tick, scratch=Path(tmp))
            await tick(fin.seconds)
            if base is not None and base.is_dir():
                (base / BASETEMP_MARK).write_text("run_conformance's --basetemp: it may be reused\n")
            total, done = _progress(progress)
            if fin.timed_out:
                raise fail("timeout_s", f"pytest did not finish within {timeout_s} s; its process group was killed "
                           f"after {len(done)} of {total if total is not None else '?'} test(s) finished")
            if fin.returncode in USAGE_EXITS or not junit.is_file():
                text = "\n".join((fin.stderr + fin.stdout).strip().splitlines()[-15:])
                argument = next((a for flag, a in (("'-k'", "keyword"), ("'-m'", "markers")) if flag in text), "tests")
                raise fail(argument, f"pytest exited {fin.returncode} ({USAGE_EXITS.get(fin.returncode, 'no results')}):\n{text}")
            counts, failures, requirements = _parse_junit(junit, max_failures)
        summary = f"finished: {counts.passed} passed, {counts.failed} failed" + (
            f", {counts.xfailed} xfailed" if counts.xfailed else "")
        await ctx.report_progress(len(done), total, summary)
        return ConformanceResult(
            passed=fin.returncode == 0,
            exit_code=fin.returncode if fin.returncode is not None else -1,
            counts=counts,
            failures=failures,
            seconds=round(fin.seconds, 3),
            command=[a for a in argv if not a.startswith("--junitxml=")],
            output_tail="\n".join(fin.stdout.strip().splitlines()[-20:]),
            requirements=requirements,
            wb_report=str(report) if report is not None and report.is_file() else None,
            basetemp=str(base) if base is not None else None,
        )
