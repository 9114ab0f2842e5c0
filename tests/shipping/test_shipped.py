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


@pytest.mark.slow
def test_the_built_wheel_carries_the_shipped_files_and_the_license(tmp_path: Path) -> None:
    src, dist = tmp_path / "src", tmp_path / "dist"
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
    names = set(zipfile.ZipFile(wheel).namelist())
    carried = {n.removeprefix("weightbridge/_shipped/") for n in names if n.startswith("weightbridge/_shipped/")}
    assert carried == set(shipped.files())
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    for must in ("weightbridge/layout/presets/vllm.yaml", "weightbridge/canonical/bundled/tiny-qwen2.json",
                 "weightbridge/py.typed", "mcp_server/server.py", "weightbridge/testing/plugin.py"):
        assert must in names, must
    assert not any(n.startswith(("tests/", "spec/", "bench/")) for n in names)
