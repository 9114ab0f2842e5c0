"""The README and spec/README.md as a newcomer reads them (issue 26, item 9 and the first hour from a wheel).

The README's ```` ```bash wheel ```` block is what CI's wheel phase runs in a venv with torch and the
wheel only (.ci/wheel_base_check.py); here: it covers every command the README's table lists, its
DeepSeek plan reads the file its ``examples --copy .`` writes, no ``$schema`` modeline dangles, and
spec/README.md's table names every field of the spec's top level and of ``sync``."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

from weightbridge.spec.models import Spec, SyncSpec

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
_spec = importlib.util.spec_from_file_location("wb_ci_wheel_base_check", REPO / ".ci" / "wheel_base_check.py")
wheel_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_base)


def _block_commands() -> list[list[str]]:
    out = []
    for line in wheel_base.readme_block(README).splitlines():
        for part in re.split(r"&&|;|\$\(", line.split("#", 1)[0]):
            words = shlex.split(part.replace(")", " "), posix=True) if part.strip() else []
            if "weightbridge" in words:
                out.append(words[words.index("weightbridge"):])
    return out


def test_the_wheel_block_runs_every_command_of_the_table() -> None:
    table = set(re.findall(r"^\| `weightbridge ([a-z]+)", README, re.M))
    assert {"demo", "plan", "probe", "store", "secret"} <= table
    ran = {words[1] for words in _block_commands()}
    assert table - ran == set(), f"commands of the README's table its wheel block does not run: {table - ran}"


def test_the_deepseek_plan_reads_the_file_examples_copy_writes() -> None:
    name = "deepseek-v3_megatron-pp16ep16_to_vllm-tp8ep8x16"
    assert (REPO / "spec" / "examples" / f"{name}.yaml").is_file()
    cmds = _block_commands()
    copy = cmds.index(["weightbridge", "examples", name, "--copy", "."])
    plan = next(i for i, c in enumerate(cmds) if c[:2] == ["weightbridge", "plan"])
    assert copy < plan and cmds[plan][2] == f"{name}.yaml"  # `--copy .` writes NAME.yaml into the directory
    # The prose says the same.
    assert f"`weightbridge plan {name}.yaml`" in README


def test_no_schema_modeline_dangles() -> None:
    for doc in ("README.md", "spec/README.md", "examples/toy_integration/weightbridge.yaml"):
        path = REPO / doc
        for target in re.findall(r"\$schema=([^\s`>]+)", path.read_text()):
            if target.startswith("<"):
                continue  # a placeholder in prose
            assert (path.parent / target).resolve().is_file(), f"{doc}: $schema={target} points nowhere"


def test_spec_readme_names_every_top_level_and_sync_field() -> None:
    text = (REPO / "spec" / "README.md").read_text()
    table = text[text.index("## Sections"):text.index("## The canonical frame")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)`[^|]*\| (.*) \|$", table, re.M)}
    assert set(Spec.model_fields) - {"version"} <= set(rows) | {"trainer", "rollout"}
    missing = [f for f in SyncSpec.model_fields if f"`{f}" not in rows["sync"]]
    assert missing == [], f"spec/README.md's sync row does not name {missing}"
    assert "`max_staleness` (async mode) bounds" in table
    assert "default `h100`" in rows["network"]
