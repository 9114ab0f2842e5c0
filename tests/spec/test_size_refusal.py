"""Sizes that do not fit the model are refused before every rank is expanded, every problem still reported.

Qwen3-235B-A22B (bundled) with ``tp: 1024`` on both sides: ``validate`` and ``plan`` exit 2 with one
``file:line: $.path: message (hint)`` line per problem, no traceback. (Before, both expanded all
1,024 ranks of each side first: minutes of CPU; the expansion work is pinned in
``tests/layout/test_expand_refusal.py``, the time is measured, not asserted.) A NUL byte or another
control character in a spec is a one-line problem at its line and column.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.spec.resolve import check_spec, check_text

TP_1024 = """\
version: 1
model:
  bundled: qwen3-235b-a22b
trainer:
  preset: megatron
  mesh: {tp: 1024}
rollout:
  preset: vllm
  instances: 1
  mesh: {tp: 1024}
"""
LINE = re.compile(r"^(?P<file>.+\.yaml):(?P<line>\d+): (?P<path>\$[^ ]*): (?P<message>.+) \((?P<hint>[^()]+)\)$")


def expected(problems_text: list[str]) -> list[tuple[int, str]]:
    return [(int(m["line"]), m["path"]) for m in map(LINE.match, problems_text) if m]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("size") / "qwen3_tp1024.yaml"
    path.write_text(TP_1024)
    return path


def test_every_size_problem_of_both_sides_is_reported(spec: Path) -> None:
    resolved, problems = check_spec(spec)
    assert resolved is None
    assert [(p.line, p.path) for p in problems] == [
        (6, "$.trainer.mesh"), (6, "$.trainer.mesh.tp"), (10, "$.rollout.mesh"), (10, "$.rollout.mesh.tp"),
    ]
    by = {p.path: p for p in problems}
    assert "dim 0 (1536) is not divisible by etp=1024" in by["$.trainer.mesh"].message  # Megatron's etp = tp
    assert by["$.trainer.mesh"].hint == ("choose etp dividing 1536; etp is not in the mesh: its size follows from "
                                         "the others, as `weightbridge presets megatron` says")
    assert "groups: 4 blocks of dim 0 are fewer than tp=1024 ranks" in by["$.trainer.mesh.tp"].message
    assert by["$.trainer.mesh.tp"].hint == "choose tp <= 4, or set replicate: true if the framework replicates them"
    assert "is not divisible by etp=1024" in by["$.rollout.mesh"].message
    assert "dim 0 (151936) is not divisible by tp=1024" in by["$.rollout.mesh.tp"].message


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_the_cli_refuses_it_with_exit_2_and_one_line_per_problem(spec: Path, command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "weightbridge", command, str(spec)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(str(spec))]
    assert expected(lines) == [(6, "$.trainer.mesh"), (6, "$.trainer.mesh.tp"), (10, "$.rollout.mesh"),
                               (10, "$.rollout.mesh.tp")], proc.stderr
    assert proc.stderr.splitlines()[-1] in ("4 problem(s) in 1 spec(s)", "4 problem(s) found")


@pytest.mark.parametrize(("text", "line", "message"), [
    ("version: 1\nmodel:\n  bundled: tiny\x00\n", 3, "a NUL byte at column 16"),
    ("version: 1\nmodel: {bundled: tiny-qwen2}\n\x00", 3, "a NUL byte at column 1"),
    ("\x00version: 1\n", 1, "a NUL byte at column 1"),
    ("version: 1\r\nmodel: x\x07\r\n", 2, "character U+0007 at column 9"),
])
def test_a_control_character_is_located_on_one_line(text: str, line: int, message: str) -> None:
    _, problems = check_text(text, "nul.yaml")
    assert len(problems) == 1
    p = problems[0]
    assert (p.line, p.path) == (line, "$")
    assert p.message == f"{message}: YAML text may not contain control characters"
    assert "\n" not in str(p)
    assert str(p).startswith(f"nul.yaml:{line}: $: {message}")
