"""A side described by its own rules and mesh axes (``preset: none``), and ``shard: column|row``.

Two integrations that used to switch off every preset rule with ``when: false`` plus a dummy
``canonical:``: a trainer with Llama-reference names (``layers.{layer}.wq.weight``) on tp x dp, and
an engine with fused ``blocks.{layer}.qkv.weight``. Each is written the new way and checked
against explicit boxes and against the same layout written the old way.
"""

from __future__ import annotations

import yaml

from weightbridge.layout.normalize import layout_fingerprint
from weightbridge.layout.presets import load_preset
from weightbridge.layout.templates import CanonicalPattern, NameIndex
from weightbridge.spec.resolve import check_text

Q, K, V, O = (f"model.layers.{{layer}}.self_attn.{n}_proj.weight" for n in "qkvo")
GATE, UP, DOWN = (f"model.layers.{{layer}}.mlp.{n}_proj.weight" for n in ("gate", "up", "down"))

# tiny-llama: hidden 128, 16 heads x 8, 8 KV heads (k/v: [64, 128]), intermediate 256, vocab 256, 2 layers.
LLAMA_REF_TRAINER = f"""\
  preset: none
  axes: [tp, dp]            # rank = tp + 2 * dp
  mesh: {{tp: 2, dp: 2}}
  rules:
    - {{local: tok_embeddings.weight, canonical: model.embed_tokens.weight, shard: column}}
    - {{local: "layers.{{layer}}.wq.weight", canonical: "{Q}", shard: column}}
    - {{local: "layers.{{layer}}.wk.weight", canonical: "{K}", shard: column}}
    - {{local: "layers.{{layer}}.wv.weight", canonical: "{V}", shard: column}}
    - {{local: "layers.{{layer}}.wo.weight", canonical: "{O}", shard: row}}
    - {{local: "layers.{{layer}}.w1.weight", canonical: "{GATE}", shard: column}}
    - {{local: "layers.{{layer}}.w3.weight", canonical: "{UP}", shard: column}}
    - {{local: "layers.{{layer}}.w2.weight", canonical: "{DOWN}", shard: row}}
    - {{local: "layers.{{layer}}.attention_norm.weight", canonical: "model.layers.{{layer}}.input_layernorm.weight"}}
    - {{local: "layers.{{layer}}.ffn_norm.weight", canonical: "model.layers.{{layer}}.post_attention_layernorm.weight"}}
    - {{local: norm.weight, canonical: model.norm.weight}}
    - {{local: output.weight, canonical: lm_head.weight, shard: column}}
"""

FUSED_BLOCKS_ROLLOUT = f"""\
  preset: none
  axes: [tp]
  mesh: {{tp: 2}}
  instances: 2
  dtype: bfloat16
  rules:
    - local: "blocks.{{layer}}.qkv.weight"          # [q; k; v], each split by rows over tp
      concat:
        dim: 0
        parts:
          - {{canonical: "{Q}", shard: column}}
          - {{canonical: "{K}", shard: column}}
          - {{canonical: "{V}", shard: column}}
    - {{local: "blocks.{{layer}}.proj.weight", canonical: "{O}", shard: row}}
    - local: "blocks.{{layer}}.fc1.weight"          # [gate; up]
      concat: {{dim: 0, parts: [{{canonical: "{GATE}", shard: column}}, {{canonical: "{UP}", shard: column}}]}}
    - {{local: "blocks.{{layer}}.fc2.weight", canonical: "{DOWN}", shard: row}}
    - {{local: wte.weight, canonical: model.embed_tokens.weight, shard: column}}
    - {{local: lm_head.weight, canonical: lm_head.weight, shard: column}}
    - {{local: "{{*}}", canonical: "{{*}}"}}     # norms: replicated under their HF names
"""


def _spec(trainer: str, rollout: str) -> str:
    return f"version: 1\nmodel: {{bundled: tiny-llama}}\ntrainer:\n{trainer}rollout:\n{rollout}"


def _resolve(text: str):
    resolved, problems = check_text(text, "s.yaml")
    assert problems == [], "\n".join(map(str, problems))
    assert resolved is not None
    return resolved


def _view(rank, local: str) -> tuple[tuple[int, ...], list[tuple]]:
    t = rank.tensor(local)
    return t.shape, sorted((p.local_box, p.canonical, p.canonical_box) for p in t.pieces)


def _old_way(side_yaml: str, preset: str) -> str:
    """``side_yaml`` as integrators had to write it: on ``preset``, every preset rule switched off
    with ``when: false`` and a dummy ``canonical:``, shorthands spelled out."""
    side = yaml.safe_load(side_yaml)
    for key in ("preset", "axes"):
        side.pop(key)
    side["preset"] = preset
    rules = []
    for rule in side["rules"]:
        parts = rule["concat"]["parts"] if "concat" in rule else [rule]
        for part in parts:
            if part.get("shard") == "column":
                part["shard"] = [{"dim": 0, "axis": "tp"}]
            elif part.get("shard") == "row":
                part["shard"] = [{"dim": 1, "axis": "tp"}]
        rules.append(rule)
    own = {r["local"] for r in rules}
    off = [{"local": local, "canonical": "model.norm.weight", "when": False}
           for local in dict.fromkeys(r.local for r in load_preset(preset).rules) if local not in own]
    side["rules"] = off + rules
    return yaml.safe_dump(side, sort_keys=False, default_flow_style=None).replace("\n", "\n  ").join(["  ", ""]).rstrip(" ")


def test_llama_reference_trainer_on_its_own_axes() -> None:
    resolved = _resolve(_spec(LLAMA_REF_TRAINER, "  preset: vllm\n  mesh: {tp: 2}\n"))
    ranks = resolved.trainer.ranks
    assert [dict(r.coords) for r in ranks] == [{"tp": 0, "dp": 0}, {"tp": 1, "dp": 0}, {"tp": 0, "dp": 1}, {"tp": 1, "dp": 1}]
    r1 = ranks[1]  # tp 1
    assert len(r1.tensors) == 1 + 2 * 9 + 2
    assert _view(r1, "layers.0.wq.weight") == ((64, 128), [(((0, 64), (0, 128)), Q.format(layer=0), ((64, 128), (0, 128)))])
    assert _view(r1, "layers.1.wk.weight") == ((32, 128), [(((0, 32), (0, 128)), K.format(layer=1), ((32, 64), (0, 128)))])
    assert _view(r1, "layers.0.wo.weight") == ((128, 64), [(((0, 128), (0, 64)), O.format(layer=0), ((0, 128), (64, 128)))])
    assert _view(r1, "layers.0.w2.weight") == ((128, 128), [(((0, 128), (0, 128)), DOWN.format(layer=0), ((0, 128), (128, 256)))])
    assert _view(r1, "tok_embeddings.weight") == ((128, 128), [(((0, 128), (0, 128)), "model.embed_tokens.weight", ((128, 256), (0, 128)))])
    assert _view(r1, "layers.1.ffn_norm.weight") == (
        (128,), [(((0, 128),), "model.layers.1.post_attention_layernorm.weight", ((0, 128),))])
    r2 = ranks[2]  # tp 0, dp 1: a replica of rank 0
    assert _view(r2, "layers.0.wq.weight") == ((64, 128), [(((0, 64), (0, 128)), Q.format(layer=0), ((0, 64), (0, 128)))])
    assert r2.tensors == ranks[0].tensors


def test_fused_blocks_engine_on_its_own_axes() -> None:
    resolved = _resolve(_spec("  preset: fsdp2\n  mesh: {dp: 2}\n", FUSED_BLOCKS_ROLLOUT))
    ranks = resolved.rollout.ranks
    assert [(r.instance, r.local_rank, dict(r.coords)) for r in ranks] == [
        (0, 0, {"tp": 0}), (0, 1, {"tp": 1}), (1, 0, {"tp": 0}), (1, 1, {"tp": 1})]
    r1 = ranks[1]
    assert _view(r1, "blocks.0.qkv.weight") == ((128, 128), [
        (((0, 64), (0, 128)), Q.format(layer=0), ((64, 128), (0, 128))),
        (((64, 96), (0, 128)), K.format(layer=0), ((32, 64), (0, 128))),
        (((96, 128), (0, 128)), V.format(layer=0), ((32, 64), (0, 128))),
    ])
    assert _view(r1, "blocks.1.fc1.weight") == ((256, 128), [
        (((0, 128), (0, 128)), GATE.format(layer=1), ((128, 256), (0, 128))),
        (((128, 256), (0, 128)), UP.format(layer=1), ((128, 256), (0, 128))),
    ])
    assert _view(r1, "blocks.0.proj.weight") == ((128, 64), [(((0, 128), (0, 64)), O.format(layer=0), ((0, 128), (64, 128)))])
    assert _view(ranks[0], "lm_head.weight") == ((128, 128), [(((0, 128), (0, 128)), "lm_head.weight", ((0, 128), (0, 128)))])
    assert r1.tensor("model.norm.weight").pieces[0].canonical_box == ((0, 128),)
    assert all(t.dtype == "bfloat16" for t in r1.tensors)
    assert ranks[3].tensors == r1.tensors  # instance 1 lays out as instance 0


def test_same_layouts_as_the_old_when_false_workarounds() -> None:
    new_t = _resolve(_spec(LLAMA_REF_TRAINER, "  preset: vllm\n  mesh: {tp: 2}\n"))
    old_trainer = _old_way(LLAMA_REF_TRAINER, "fsdp2")
    assert old_trainer.count("when: false") == 17  # every fsdp2 rule (local templates), the {*} fallback included
    old_t = _resolve(_spec(old_trainer, "  preset: vllm\n  mesh: {tp: 2}\n"))
    assert [layout_fingerprint(r) for r in new_t.trainer.ranks] == [layout_fingerprint(r) for r in old_t.trainer.ranks]
    new_r = _resolve(_spec("  preset: fsdp2\n  mesh: {dp: 2}\n", FUSED_BLOCKS_ROLLOUT))
    old_rollout = _old_way(FUSED_BLOCKS_ROLLOUT, "vllm")
    assert old_rollout.count("when: false") == 26  # every vllm rule but lm_head.weight and {*}, restated
    old_r = _resolve(_spec("  preset: fsdp2\n  mesh: {dp: 2}\n", old_rollout))
    assert [layout_fingerprint(r) for r in new_r.rollout.ranks] == [layout_fingerprint(r) for r in old_r.rollout.ranks]


def test_mesh_family_borrows_a_presets_numbering_and_stages() -> None:
    """``preset: none`` + ``mesh_family: vllm`` + the vllm preset's rules = ``preset: vllm``."""
    preset = load_preset("vllm")
    native = _resolve(_spec("  preset: hf\n", "  preset: vllm\n  mesh: {tp: 2, pp: 2}\n").replace("tiny-llama", "tiny-qwen2"))
    index = NameIndex(t.name for t in native.canonical.tensors)  # spec rules must match something; preset rules need not
    rules = [r.model_dump(mode="json", exclude_defaults=True) for r in preset.rules
             if r.is_fallback or all(index.match(CanonicalPattern.compile(t))
                                     for t in (r.parts()[0].canonical, *r.requires))]
    own = {"preset": "none", "mesh_family": "vllm", "mesh": {"tp": 2, "pp": 2}, "params": dict(preset.params), "rules": rules}
    trainer = "  preset: hf\n"
    text = _spec(trainer, "  " + yaml.safe_dump(own).replace("\n", "\n  ").rstrip(" "))
    borrowed = _resolve(text.replace("tiny-llama", "tiny-qwen2"))
    assert [r.coords for r in borrowed.rollout.ranks] == [r.coords for r in native.rollout.ranks]
    assert [r.tensors for r in borrowed.rollout.ranks] == [r.tensors for r in native.rollout.ranks]


def test_own_axes_with_a_pipeline_axis() -> None:
    rollout = """\
  preset: none
  axes: [tp, pp]
  mesh: {tp: 2, pp: 2}
  rules:
    - {local: embed, canonical: model.embed_tokens.weight, shard: column, stage: first}
    - {local: head, canonical: lm_head.weight, shard: column, stage: last}
    - {local: final_norm, canonical: model.norm.weight, stage: last}
    - {local: "{*}", canonical: "{*}"}
"""
    resolved = _resolve(_spec("  preset: hf\n", rollout))
    r3 = resolved.rollout.ranks[3]  # tp 1, pp 1: layer 1, head, final norm
    assert dict(r3.coords) == {"tp": 1, "pp": 1}
    names = {t.name for t in r3.tensors}
    assert {"head", "final_norm"} <= names and "embed" not in names
    assert not any(".layers.0." in n for n in names) and any(".layers.1." in n for n in names)


def test_every_problem_of_custom_sides_is_reported_at_its_line() -> None:
    text = """\
version: 1
model: {bundled: tiny-llama}
trainer:
  preset: none
  axes: [tp, dp, tp]
  mesh: {tp: 2, dp: 2, ep: 2, mp: 4}
  rules:
    - {local: "layers.{layer}.wq.weight", canonical: "model.layers.{layer}.self_attn.q_proj.weight", shard: [{dim: 0, axis: mp}]}
    - local: "layers.{layer}.qkv"
      concat:
        dim: 0
        parts:
          - {canonical: "model.layers.{layer}.self_attn.q_proj.weight", shard: column}
          - {canonical: "model.layers.{layer}.self_attn.k_proj.weight", shard: [{dim: 0, axis: tq}]}
    - {local: "{*}", canonical: "{*}", shard: colum}
rollout:
  preset: none
  mesh: {tp: 2}
  rules:
    - {local: x, canonical: model.norm.weight, shard: row}
"""
    _, problems = check_text(text, "s.yaml")
    got = [(p.line, p.path) for p in problems]
    assert got == [
        (5, "$.trainer.axes[2]"),
        (15, "$.trainer.rules[2].shard"),
        (17, "$.rollout.preset"),
    ], "\n".join(map(str, problems))
    by_path = {p.path: p for p in problems}
    assert "declared twice" in by_path["$.trainer.axes[2]"].message
    assert by_path["$.trainer.rules[2].shard"].hint == "did you mean 'column'?"
    assert "needs the side's mesh axes" in by_path["$.rollout.preset"].message
    # Fixed those three, expansion reports each undeclared axis where it is named.
    fixed = text.replace("[tp, dp, tp]", "[tp, dp]").replace("colum}", "column}").replace(
        "rollout:\n  preset: none\n", "rollout:\n  preset: none\n  axes: [dp]\n")
    _, problems = check_text(fixed, "s.yaml")
    got = [(p.line, p.path) for p in problems]
    assert got == [
        (6, "$.trainer.mesh.ep"),
        (6, "$.trainer.mesh.mp"),
        (8, "$.trainer.rules[0].shard[0].axis"),
        (14, "$.trainer.rules[1].concat.parts[1].shard[0].axis"),
        (19, "$.rollout.mesh.tp"),
        (21, "$.rollout.rules[0].shard[0].axis"),  # the step `shard: row` stands for
    ], "\n".join(map(str, problems))
    by_path = {p.path: p for p in problems}
    assert "not among the declared axes (tp, dp)" in by_path["$.trainer.mesh.mp"].message
    assert "unknown mesh axis 'tq'" in by_path["$.trainer.rules[1].concat.parts[1].shard[0].axis"].message
    assert "unknown mesh axis 'tp'" in by_path["$.rollout.rules[0].shard[0].axis"].message
    assert "declare it in the side's axes" in by_path["$.rollout.rules[0].shard[0].axis"].hint


def test_axes_belong_to_preset_none() -> None:
    text = _spec("  preset: hf\n  axes: [tp]\n  mesh_family: fsdp2\n", "  preset: vllm\n")
    _, problems = check_text(text, "s.yaml")
    assert [(p.line, p.path) for p in problems] == [(5, "$.trainer.axes"), (6, "$.trainer.mesh_family")]
    assert "goes with preset: none" in problems[0].message
    text = _spec("  preset: none\n  axes: [tp]\n  mesh_family: fsdp2\n  rules: [{local: '{*}', canonical: '{*}'}]\n", "  preset: vllm\n")
    _, problems = check_text(text, "s.yaml")
    assert [(p.path, p.message) for p in problems] == [("$.trainer.mesh_family", "give axes or mesh_family, not both")]


def test_shorthands_mean_the_spelled_out_steps() -> None:
    from weightbridge.layout.rules import Rule

    assert Rule(local="a", canonical="b", shard="column") == Rule(local="a", canonical="b", shard=[{"dim": 0, "axis": "tp"}])
    assert Rule(local="a", canonical="b", shard="row").shard[0].model_dump(exclude_defaults=True) == {"dim": 1, "axis": "tp"}


def test_a_shorthand_spec_hashes_like_the_spelled_out_one() -> None:
    short = _spec(LLAMA_REF_TRAINER, "  preset: vllm\n  mesh: {tp: 2}\n")
    spelled = short.replace("shard: column", "shard: [{dim: 0, axis: tp}]").replace("shard: row", "shard: [{dim: 1, axis: tp}]")
    assert "column" not in spelled
    assert _resolve(short).spec_hash == _resolve(spelled).spec_hash
