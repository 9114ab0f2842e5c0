"""Users override or add preset rules in the spec, without Python."""

from __future__ import annotations

from weightbridge.spec.resolve import check_text

BASE = """\
version: 1
model: {bundled: tiny-llama}
trainer: {preset: hf}
rollout:
  preset: vllm
  mesh: {tp: 2}
"""


def test_override_replaces_preset_rule_and_adds_transposed_rule() -> None:
    text = BASE + """\
  rules:
    - local: model.layers.{layer}.mlp.down_proj.weight     # same template as the preset: replaces it
      canonical: model.layers.{layer}.mlp.down_proj.weight
      transpose: true
      shard: [{dim: 1, axis: tp}]
    - local: lm_head.weight_t                              # added: a transposed copy, float32
      canonical: lm_head.weight
      transpose: true
      dtype: float32
"""
    resolved, problems = check_text(text)
    assert problems == [], [str(p) for p in problems]
    r1 = resolved.rollout.ranks[1]
    down = r1.tensor("model.layers.0.mlp.down_proj.weight")
    canonical = resolved.canonical["model.layers.0.mlp.down_proj.weight"].shape  # [hidden, intermediate]
    assert down.shape == (canonical[1] // 2, canonical[0])
    (piece,) = down.pieces
    assert piece.transpose and piece.canonical_box == ((0, canonical[0]), (canonical[1] // 2, canonical[1]))
    assert piece.local_box == ((0, canonical[1] // 2), (0, canonical[0]))
    extra = r1.tensor("lm_head.weight_t")
    assert extra.dtype == "float32" and extra.pieces[0].transpose


def test_user_rule_that_matches_nothing_is_reported() -> None:
    text = BASE + """\
  rules:
    - local: nothing
      canonical: model.layers.{layer}.mlp.nonexistent.weight
"""
    _, problems = check_text(text, "s.yaml")
    assert [(p.path, p.line) for p in problems] == [("$.rollout.rules[0]", 8)]
    assert "matches no canonical tensor" in problems[0].message


def test_two_rules_making_one_local_tensor_is_reported() -> None:
    text = BASE + """\
  rules:
    - local: model.norm.weight
      canonical: model.layers.0.input_layernorm.weight
"""
    _, problems = check_text(text, "s.yaml")
    assert any("produced by two rules" in p.message for p in problems), [str(p) for p in problems]
