"""What ships with the package (weightbridge.shipped), the commands that reach it, and the wheel itself.

The wheel check of CI (.ci/wheel_check.py) installs the wheel into a fresh venv; here the same
table is checked against the checkout, links in the docs against the table, and (slow) a wheel
built from the tracked tree against the table.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from weightbridge import shipped
from weightbridge.cli.main import main as cli
from weightbridge.spec.schema import SCHEMA_FILENAME, default_schema_path

REPO = Path(__file__).resolve().parents[2]


def test_the_checkout_is_the_shipped_root_and_everything_pointed_to_is_there() -> None:
    assert shipped.root() == REPO and not shipped.installed()
    names = set(shipped.files())
    for must in ("LICENSE", "README.md", "llms.txt", "spec/README.md", f"spec/schema/{SCHEMA_FILENAME}",
                 "spec/schema/CHANGELOG.md", "spec/examples/tiny_fsdp2_to_vllm.yaml", "docs/planner.md",
                 "docs/probing.md", "integration_guides/README.md", "integration_guides/mcp.md",
                 "examples/toy_integration/weightbridge.yaml", "examples/toy_integration/toyrl/conformance.py"):
        assert must in names, must
    assert "Apache License" in (REPO / "LICENSE").read_text() and "Version 2.0" in (REPO / "LICENSE").read_text()
    assert default_schema_path() == REPO / "spec" / "schema" / SCHEMA_FILENAME


_LINK = re.compile(r"\]\(([^)#\s]+)")


@pytest.mark.parametrize("doc", ["README.md", "llms.txt", "AGENTS.md", "spec/README.md", "integration_guides/README.md"])
def test_every_relative_link_in_a_shipped_doc_ships(doc: str) -> None:
    names = set(shipped.files())
    base = Path(doc).parent
    missing = []
    for target in _LINK.findall((REPO / doc).read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        rel = os.path.normpath(base / target).replace(os.sep, "/")
        if rel.endswith(".py") and rel.startswith(("weightbridge/", "mcp_server/")):
            continue  # code: in the wheel as a module
        if rel.rstrip("/") in names or any(n.startswith(rel.rstrip("/") + "/") for n in names):
            continue
        missing.append(target)
    assert missing == [], f"{doc} links to files the wheel does not carry: {missing}"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_examples_lists_prints_and_copies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "examples")
    assert code == 0 and "tiny_fsdp2_to_vllm" in out and "toy_integration" in out
    code, out, _ = _run(capsys, "examples", "tiny_fsdp2_to_vllm")
    assert code == 0 and out == (REPO / "spec/examples/tiny_fsdp2_to_vllm.yaml").read_text()
    code, out, _ = _run(capsys, "examples", "--copy", str(tmp_path / "specs"))
    assert code == 0 and sorted(p.name for p in (tmp_path / "specs").iterdir()) == sorted(
        p.name for p in (REPO / "spec/examples").glob("*.yaml"))
    code, _, err = _run(capsys, "examples", "tiny_fsdp2_to_vllm", "--copy", str(tmp_path / "specs"))
    assert code == 2 and "exists; not overwriting" in err
    code, out, _ = _run(capsys, "examples", "toy_integration", "--copy", str(tmp_path))
    assert code == 0
    toy = tmp_path / "toy_integration"
    assert (toy / "toyrl" / "conformance.py").read_bytes() == (REPO / "examples/toy_integration/toyrl/conformance.py").read_bytes()
    assert code == _run(capsys, "validate", str(toy / "weightbridge.yaml"))[0] == 0


def test_examples_copies_the_engine_suites_and_benchmarks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "examples")
    assert code == 0 and "engine_suites" in out and "bench" in out
    code, out, _ = _run(capsys, "examples", "engine_suites", "--copy", str(tmp_path))
    suites = tmp_path / "engine_suites"
    names = ["megatron", "sglang", "vllm"]  # directories NAME_suite: a directory named like a package would shadow it
    assert code == 0 and sorted(p.name for p in suites.iterdir() if p.is_dir()) == [f"{n}_suite" for n in names]
    for name in names:
        assert {p.name for p in (suites / f"{name}_suite").iterdir()} >= {"conftest.py", "weightbridge.yaml",
                                                                         f"test_wbsuite_{name}.py"}
        assert _run(capsys, "validate", str(suites / f"{name}_suite" / "weightbridge.yaml"))[0] == 0, name
    code, out, _ = _run(capsys, "examples", "bench", "--copy", str(tmp_path))
    assert code == 0 and sorted(p.name for p in (tmp_path / "bench").iterdir()) == ["sglang_update.py", "vllm_update.py"]


def test_examples_and_docs_refuse_unknown_names_briefly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "examples", "x" * 100_000)
    assert code == 2 and "no example" in err and len(err) < 2000 and "(100000 chars)" in err
    (tmp_path / "file").write_text("")
    code, _, err = _run(capsys, "examples", "--copy", str(tmp_path / "file"))
    assert code == 2 and "not a directory" in err
    code, _, err = _run(capsys, "examples", "--copy", str(tmp_path / "a\0b"))
    assert code == 2 and "cannot copy" in err
    code, _, err = _run(capsys, "docs", "nonexistent")
    assert code == 2 and "planner" in err


def test_docs_lists_and_prints(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "docs")
    assert code == 0 and all(n in out for n in ("planner", "probing", "spec", "guide/vllm", "guide/checklist"))
    code, out, _ = _run(capsys, "docs", "planner")
    assert code == 0 and out == (REPO / "docs/planner.md").read_text()


def test_schema_write_refuses_the_installed_copy_and_bad_paths(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipped, "installed", lambda: True)
    before = default_schema_path().read_text()
    code, _, err = _run(capsys, "schema", "--write")
    assert code == 2 and "ships with the installed package" in err and default_schema_path().read_text() == before
    code, _, err = _run(capsys, "schema", "--write", "--path", str(tmp_path))
    assert code == 2 and "is a directory" in err
    code, out, _ = _run(capsys, "schema", "--write", "--path", str(tmp_path / "s.json"))
    assert code == 0 and (tmp_path / "s.json").read_text() == before
    code, _, err = _run(capsys, "schema", "--write", "--path", str(tmp_path / "a\0b.json"))
    assert code == 2 and "cannot write" in err


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The file names in a wheel built from the tracked tree (uncommitted files included, ignored ones not)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    for rel in filter(None, listed):
        p = REPO / rel.decode()
        if p.is_file():
            (src / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            (src / rel.decode()).write_bytes(p.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = dist.glob("weightbridge_rl-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


@pytest.mark.slow
def test_the_built_wheel_carries_the_shipped_files_and_the_license(wheel_names: set[str]) -> None:
    names = wheel_names
    carried = {n.removeprefix("weightbridge/_shipped/") for n in names if n.startswith("weightbridge/_shipped/")}
    assert carried == set(shipped.files())
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    for must in ("weightbridge/layout/presets/vllm.yaml", "weightbridge/canonical/bundled/tiny-qwen2.json",
                 "weightbridge/py.typed", "mcp_server/server.py", "weightbridge/testing/plugin.py"):
        assert must in names, must
    assert not any(n.startswith(("tests/", "spec/", "bench/")) for n in names)


# A path into weightbridge's tree, as guides write them (`bench/vllm_update.py`, `tests/x/`, ...).
_TREE_PATH = re.compile(r"(?<![\w./$-])((?:tests|bench|\.ci|examples|spec|docs|integration_guides|weightbridge|"
                        r"mcp_server)/[\w./-]*)")
# "(the repository's `tests/a.py` and `tests/b/`)": citations of the source repository (where something
# is tested), not files the reader is pointed to use; they run to the end of the clause.
_CITED = re.compile(r"the repository's [^.();]*$", re.IGNORECASE)


def tree_paths_missing(text: str, names: set[str]) -> list[str]:
    """``line: path`` for every path ``text`` names that a wheel with ``names`` lacks (neither a
    module of the package nor a shipped file or directory), repository citations excepted."""
    carried = {n.removeprefix("weightbridge/_shipped/") for n in names if n.startswith("weightbridge/_shipped/")}
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _TREE_PATH.finditer(line):
            path = match.group(1).rstrip(".").rstrip("/")
            if _CITED.search(_TREE_PATH.sub("", line[:match.start()])):  # paths' own dots end no clause
                continue
            if not any(path in have or any(n.startswith(path + "/") for n in have) for have in (names, carried)):
                missing.append(f"{number}: {match.group(1)}")
    return missing


def test_the_guide_path_check_sees_what_a_wheel_lacks() -> None:
    names = {"weightbridge/_shipped/examples/engine_suites/vllm/conftest.py", "weightbridge/bridge.py"}
    text = ("run `examples/engine_suites/vllm/` and `weightbridge/bridge.py`\n"
            "then `python bench/vllm_update.py`, see tests/vllm_engine/ (the repository's `tests/x.py` and `.ci/y`)\n"
            "(the repository's `tests/z.py`). And `tests/w.py`\n")
    assert tree_paths_missing(text, names) == ["2: bench/vllm_update.py", "2: tests/vllm_engine/", "3: tests/w.py"]


@pytest.mark.slow
def test_every_path_an_integration_guide_names_is_in_the_wheel(wheel_names: set[str]) -> None:
    """Issue 33: the guides pointed wheel users to tests/conformance/vllm_suite/, bench/vllm_update.py,
    .ci/sglang_venv.sh, ... which only a source checkout has."""
    guides = [f for f in shipped.files() if f.startswith("integration_guides/") or
              (f.startswith("examples/") and f.endswith(".md"))]
    assert "integration_guides/vllm.md" in guides and "examples/engine_suites/README.md" in guides
    missing = {doc: tree_paths_missing((REPO / doc).read_text(), wheel_names) for doc in guides}
    assert {doc: m for doc, m in missing.items() if m} == {}
