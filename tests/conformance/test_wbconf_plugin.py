"""The pytest plugin as an integrator meets it: inert by default, actionable when a fixture is missing,
known gaps as strict xfail, requirement ids in junit XML and in the --wb-report JSON."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

from wbconf_pytest import EXAMPLE, run_pytest

SPEC = EXAMPLE / "weightbridge.yaml"
SUITE = "from weightbridge.testing import ConformanceSuite\n\n\nclass {name}(ConformanceSuite):\n{body}\n"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_the_plugin_is_registered_as_a_pytest11_entry_point_and_imports_without_torch():
    eps = [e for e in entry_points(group="pytest11") if e.name == "weightbridge"]
    assert [e.value for e in eps] == ["weightbridge.testing.plugin"]
    code = "import sys, weightbridge.testing.plugin; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_session_without_the_suite_is_untouched(tmp_path):
    write(tmp_path / "plain" / "test_plain.py", "def test_ok():\n    pass\n")
    out = run_pytest([str(tmp_path / "plain")], tmp_path, cwd=tmp_path)
    assert out.returncode == 0 and out.cases == {"test_plain::test_ok": {
        "outcome": "passed", "message": "", "requirement": None}}
    assert "weightbridge conformance" not in out.output and out.report == {}


def test_missing_fixtures_conftest_factories_and_known_gaps_each_fail_with_what_to_do(tmp_path):
    write(tmp_path / "missing" / "test_missing.py", SUITE.format(name="TestMissing", body="    pass"))
    write(tmp_path / "inconftest" / "conftest.py", f"""
        import pytest

        def build(ctx):
            raise AssertionError("never called")

        @pytest.fixture
        def wb_spec():
            return {str(SPEC)!r}

        @pytest.fixture
        def wb_trainer():
            return build

        @pytest.fixture
        def wb_rollout():
            return build
        """)
    write(tmp_path / "inconftest" / "test_inconftest.py", SUITE.format(name="TestInConftest", body="    pass"))
    write(tmp_path / "gaps" / "conftest.py", f"""
        import pytest

        @pytest.fixture
        def wb_spec():
            return {str(SPEC)!r}

        @pytest.fixture
        def wb_trainer():
            return "toyrl.conformance:build_trainer"

        @pytest.fixture
        def wb_rollout():
            return "toyrl.conformance:build_rollout"
        """)
    write(tmp_path / "gaps" / "test_gaps.py",
          SUITE.format(name="TestGaps", body="    known_gaps = {'spec.resolve.clean': 'pretend it is missing'}"))
    out = run_pytest([".", "-k", "spec_validates"], tmp_path, cwd=tmp_path, env={"PYTHONPATH": str(EXAMPLE)})
    test = "test_the_spec_validates_and_resolves"
    missing, conf, gap = (out.cases[f"{c}::{test}"] for c in ("TestMissing", "TestInConftest", "TestGaps"))
    assert missing["outcome"] == "error" and missing["requirement"] == "spec.resolve.clean"
    assert "fixture 'wb_spec' is missing. Add it to your conftest.py:" in missing["message"]
    assert "@pytest.fixture\n    def wb_spec():" in missing["message"]
    assert conf["outcome"] == "error"
    assert "wb_trainer returned build from conftest: rank processes cannot import it" in conf["message"]
    assert "move it to a module of its own" in conf["message"]
    assert gap["outcome"] == "failure" and "[XPASS(strict)] known gap spec.resolve.clean: pretend" in gap["message"]
    assert out.returncode == 1 and "weightbridge conformance" in out.output


def test_a_known_gap_naming_an_unknown_requirement_stops_the_session(tmp_path):
    write(tmp_path / "test_badgap.py", SUITE.format(name="TestBadGap", body="    known_gaps = {'sync.push': 'x'}"))
    out = run_pytest(["--collect-only"], tmp_path, cwd=tmp_path)
    assert out.returncode == 4, out.output
    assert "TestBadGap.known_gaps: known_gaps names unknown requirement 'sync.push'" in out.output
