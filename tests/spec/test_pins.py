"""Pinned layout fingerprints: the spec's expansion must give them; a changed layout is reported at the pin."""

from __future__ import annotations

from weightbridge.layout.normalize import layout_fingerprint
from weightbridge.spec.resolve import check_text

BASE = """\
version: 1
model: {bundled: tiny-qwen2}
trainer:
  preset: fsdp2
  mesh: {dp: 2}
rollout:
  preset: vllm
  instances: 2
  mesh: {tp: 2}
"""


def _fingerprints() -> list[str]:
    resolved, problems = check_text(BASE)
    assert not problems
    assert resolved is not None
    return [layout_fingerprint(r) for r in sorted(resolved.rollout.instance_ranks(0), key=lambda r: r.local_rank)]


def test_fingerprints_differ_per_rank_and_equal_across_instances() -> None:
    resolved, _ = check_text(BASE)
    assert resolved is not None
    fp = _fingerprints()
    assert fp[0] != fp[1]
    other = sorted(resolved.rollout.instance_ranks(1), key=lambda r: r.local_rank)
    assert [layout_fingerprint(r) for r in other] == fp


def test_correct_pins_validate() -> None:
    fp = _fingerprints()
    resolved, problems = check_text(BASE + f"  pins: {{0: '{fp[0]}', 1: '{fp[1]}'}}\n")
    assert problems == []
    assert resolved is not None and resolved.spec.rollout.pins == {0: fp[0], 1: fp[1]}


def test_wrong_and_out_of_range_pins_are_each_reported_at_their_line() -> None:
    fp = _fingerprints()
    text = BASE + f"  pins:\n    0: '{fp[1]}'\n    1: '{fp[1]}'\n    5: '{fp[0]}'\n"
    _, problems = check_text(text, "s.yaml")
    got = sorted((p.path, p.line) for p in problems)
    assert got == [("$.rollout.pins[0]", 11), ("$.rollout.pins[5]", 13)]
    msg = {p.path: p.message for p in problems}
    assert f"not the pinned {fp[1]}" in msg["$.rollout.pins[0]"]
    assert "out of range" in msg["$.rollout.pins[5]"]


def test_a_pin_must_look_like_a_fingerprint() -> None:
    _, problems = check_text(BASE + "  pins: {0: 'abc'}\n", "s.yaml")
    assert [(p.path, p.line) for p in problems] == [("$.rollout.pins[0]", 10)]
