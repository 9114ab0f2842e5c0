"""Spec validation reports every problem, each as file:line: $.path: message (hint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.spec.resolve import check_spec, check_text

DATA = Path(__file__).parent / "data"

VALID = """\
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 2, mesh: {tp: 2}}
"""


def test_five_mistakes_all_reported_with_lines() -> None:
    resolved, problems = check_spec(DATA / "five_mistakes.yaml")
    assert resolved is None
    got = [(p.line, p.path) for p in problems]
    assert got == [
        (8, "$.trainer.mesh.tp"),
        (13, "$.trainer.rules[0].shard[0].axis"),
        (15, "$.rollout.preset"),
        (19, "$.sync.mode"),
        (20, "$.sync.round_bytes"),
    ]
    by_path = {p.path: p for p in problems}
    assert "not divisible by tp=3" in by_path["$.trainer.mesh.tp"].message
    assert "unknown mesh axis 'tq'" in by_path["$.trainer.rules[0].shard[0].axis"].message
    assert by_path["$.rollout.preset"].hint == "did you mean 'vllm'?"
    assert by_path["$.sync.mode"].hint == "did you mean 'async'?"
    assert "not a byte size" in by_path["$.sync.round_bytes"].message
    text = str(by_path["$.rollout.preset"])
    assert text.endswith("five_mistakes.yaml:15: $.rollout.preset: 'vlm' is not allowed here (did you mean 'vllm'?)")


def test_cli_exit_2_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "weightbridge", "validate", str(DATA / "five_mistakes.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "five_mistakes.yaml:" in ln]
    assert len(lines) == 5
    assert proc.stderr.strip().endswith("5 problem(s) in 1 spec(s)")


def test_valid_spec_has_no_problems() -> None:
    resolved, problems = check_text(VALID)
    assert problems == []
    assert resolved is not None
    assert resolved.trainer.world_size == 2
    assert resolved.rollout.world_size == 4 and resolved.rollout.num_instances == 2


@pytest.mark.parametrize(
    ("text", "path", "line", "needle"),
    [
        ("version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2}\n", "$", 1, "'rollout' is required"),
        (VALID + "netwrok: h100\n", "$.netwrok", 5, "unknown key 'netwrok'"),
        (VALID.replace("tiny-qwen2", "tiny-qwen9"), "$.model.bundled", 2, "tiny-qwen9"),
        (VALID.replace("{dp: 2}", "{dp: 2, pp: 2}"), "$.trainer.mesh.pp", 3, "unknown mesh axis 'pp'"),
        (VALID.replace("{tp: 2}", "{tp: 2, ep: 3}"), "$.rollout.mesh.ep", 4, "ep = 3 must be 1 or equal tp = 2"),
        (VALID.replace("version: 1", "version: 2"), "$.version", 1, "must be 1"),
        (VALID.replace("preset: fsdp2", "preset: fsdp2, instances: 2"), "$.trainer.instances", 3, "one instance"),
        (VALID.replace("preset: vllm", "preset: megatron"), "$.rollout.preset", 4, "trainer preset"),
        (VALID + "trainer: {preset: hf}\n", "$.trainer", 5, "duplicate key"),
        ("version: 1\nmodel: [\n", "$", 3, "YAML syntax error"),
    ],
)
def test_single_mistakes(text: str, path: str, line: int, needle: str) -> None:
    _, problems = check_text(text, "t.yaml")
    assert any(p.path == path and p.line == line and needle in p.message for p in problems), [str(p) for p in problems]


def test_uncovered_canonical_tensors_are_reported_by_pattern() -> None:
    # A megatron trainer on a model whose router the preset does not know: inline tensors.
    text = """\
version: 1
model:
  tensors:
    - {name: model.layers.0.mlp.router_logits_scale, shape: [4], dtype: float32}
    - {name: model.layers.1.mlp.router_logits_scale, shape: [4], dtype: float32}
    - {name: model.norm.weight, shape: [4], dtype: float32}
trainer: {preset: megatron}
rollout: {preset: vllm}
"""
    _, problems = check_text(text, "t.yaml")
    assert [(p.path, p.line) for p in problems] == [("$.trainer.preset", 7)]
    assert "2 canonical tensor(s) held by no trainer rank: model.layers.*.mlp.router_logits_scale (x2)" in problems[0].message


def test_tp_not_dividing_kv_heads_points_at_mesh_axis() -> None:
    _, problems = check_text(VALID.replace("{tp: 2}", "{tp: 3}"), "t.yaml")
    assert [p.path for p in problems] == ["$.rollout.mesh.tp"]
    assert problems[0].line == 4


def test_validate_warns_for_each_side_never_checked_against_a_live_loader(tmp_path: Path) -> None:
    """Issue 33: a spec that validates can still describe another layout than the live framework
    holds; a side without pins (the fingerprints of a probe of its own loader) is now named."""
    import json

    from weightbridge.layout.normalize import layout_fingerprint

    resolved, _ = check_text(VALID)
    pins = {side: {i: layout_fingerprint(resolved.side(side).ranks[i]) for i in range(2)}
            for side in ("trainer", "rollout")}  # rollout: local ranks 0, 1 of an instance
    cases = {"none": VALID,
             "trainer": VALID.replace("mesh: {dp: 2}}", f"mesh: {{dp: 2}}, pins: {json.dumps(pins['trainer'])}}}"),
             "both": VALID.replace("mesh: {dp: 2}}", f"mesh: {{dp: 2}}, pins: {json.dumps(pins['trainer'])}}}")
                          .replace("mesh: {tp: 2}}", f"mesh: {{tp: 2}}, pins: {json.dumps(pins['rollout'])}}}")}
    got = {}
    for name, text in cases.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        out = subprocess.run([sys.executable, "-m", "weightbridge", "validate", str(tmp_path / f"{name}.yaml")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and ": ok — " in out.stdout, out.stderr
        got[name] = [line.split(": warning: ")[1].split(":")[0] for line in out.stderr.splitlines()]
        assert all("never checked against a live loader" in line for line in out.stderr.splitlines())
    assert got == {"none": ["trainer", "rollout"], "trainer": ["rollout"], "both": []}
