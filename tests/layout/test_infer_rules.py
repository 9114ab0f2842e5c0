"""Rules written from probed layouts (``layout.infer`` / ``weightbridge rules``): for layouts made by
known rules (standing in for an engine's probe files), the inferred rules expand to exactly the
same boxes, rank by rank; what the vocabulary cannot say is reported, not guessed.

Property: random parts (slice, shard over tp with blocks replicated on consecutive ranks, permute),
alone or concatenated, at tp 1-4. Cases: Phi-3's fused qkv split per rank, gpt-oss's permuted
experts, and the CLI on probe JSON files (exit 0 with the rules; 1 when something stays different).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightbridge.layout.infer import infer_rules
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor
from weightbridge.layout.normalize import layout_fingerprint
from weightbridge.ops.rules_from_probe import rules_from_probes

from ._materialise import build

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _expand(model: CanonicalModel, tp: int, rules: list[dict]):
    _, layout, problems = build("rollout", "none", {"tp": tp}, model, axes=["tp"], rules=rules)
    assert problems == [], [p.message for p in problems]
    return layout.ranks


@st.composite
def part(draw, name: str, tp: int):
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(ndim)]
    p: dict = {"canonical": name}
    d = draw(st.integers(0, ndim - 1))
    if draw(st.booleans()):  # sharded along d: tp blocks (or fewer, replicated) of `unit` rows each
        blocks = draw(st.sampled_from([b for b in (1, 2, 4) if tp % b == 0 or b % tp == 0]))
        unit = draw(st.integers(1, 3))
        extra = draw(st.integers(0, 2))  # rows outside the sliced window
        shape[d] = blocks * unit + extra
        step = {"dim": d, "axis": "tp", "blocks": blocks}
        if blocks < tp:
            step["replicate"] = True
        p["shard"] = [step]
        if extra:
            p["slice"] = [{"dim": d, "start": extra, "stop": shape[d]}]
    elif draw(st.booleans()) and shape[d] > 1:
        p["slice"] = [{"dim": d, "start": 1, "stop": shape[d]}]
    if draw(st.booleans()) and ndim > 1:
        p["permute"] = draw(st.permutations(range(ndim)))
    return tuple(shape), p


@PROPS
@given(st.integers(1, 4).flatmap(lambda tp: st.tuples(st.just(tp), part("a", tp))))
def test_inferred_rule_expands_to_the_same_boxes(case) -> None:
    tp, (shape, p) = case
    model = CanonicalModel((CanonicalTensor("a", shape, "float32"),))
    truth = _expand(model, tp, [{"local": "x", **p}])
    inferred = infer_rules(model, truth, axis="tp")
    assert inferred.unexplained == (), inferred.unexplained
    again = _expand(model, tp, list(inferred.rules))
    assert [layout_fingerprint(r) for r in again] == [layout_fingerprint(r) for r in truth], (p, inferred.rules)


PHI3 = """version: 1
model:
  tensors:
    - {name: model.layers.0.self_attn.qkv_proj.weight, shape: [256, 128], dtype: bfloat16}
    - {name: model.layers.1.self_attn.qkv_proj.weight, shape: [256, 128], dtype: bfloat16}
    - {name: model.layers.0.mlp.experts.gate_up_proj, shape: [4, 128, 64], dtype: bfloat16}
  params: {num_heads: 4, num_kv_heads: 2, head_dim: 32, num_layers: 2}
trainer: {preset: hf}
rollout:
  preset: vllm
  mesh: {tp: 2}
"""
TRUTH_RULES = [
    {"local": "model.layers.{layer}.self_attn.qkv_proj.weight", "concat": {"dim": 0, "parts": [
        {"canonical": "model.layers.{layer}.self_attn.qkv_proj.weight", "slice": [{"dim": 0, "stop": 128}],
         "shard": [{"dim": 0, "axis": "tp", "blocks": "num_heads"}]},
        {"canonical": "model.layers.{layer}.self_attn.qkv_proj.weight", "slice": [{"dim": 0, "start": 128, "stop": 192}],
         "shard": [{"dim": 0, "axis": "tp", "blocks": "num_kv_heads"}]},
        {"canonical": "model.layers.{layer}.self_attn.qkv_proj.weight", "slice": [{"dim": 0, "start": 192}],
         "shard": [{"dim": 0, "axis": "tp", "blocks": "num_kv_heads"}]}]}},
    {"local": "model.layers.{layer}.mlp.experts.w13_weight", "canonical": "model.layers.{layer}.mlp.experts.gate_up_proj",
     "shard": [{"dim": 2, "axis": "tp"}], "permute": [0, 2, 1]},
]


def _probes(tmp_path: Path) -> tuple[Path, list[Path]]:
    from weightbridge.spec.resolve import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(PHI3)
    truth = tmp_path / "truth.yaml"
    data = yaml.safe_load(PHI3)
    data["rollout"]["rules"] = TRUTH_RULES
    truth.write_text(yaml.safe_dump(data))
    paths = []
    for r in load_spec(truth).rollout.ranks:  # what probing the engine's loader gives, rank by rank
        paths.append(tmp_path / f"probe{r.rank}.json")
        paths[-1].write_text(json.dumps(r.to_json()))
    return spec, paths


def test_phi3_fused_qkv_and_gpt_oss_experts_from_probes(tmp_path: Path) -> None:
    from weightbridge.probe.diff import load_source

    spec, paths = _probes(tmp_path)
    found = rules_from_probes(spec, "rollout", [load_source(str(p)) for p in paths])
    assert found.ok and found.unexplained == [], (found.remaining, found.unexplained)
    by_local = {r["local"]: r for r in found.rules}
    qkv = by_local["model.layers.{layer}.self_attn.qkv_proj.weight"]["concat"]["parts"]
    assert [(p["slice"], p["shard"]) for p in qkv] == [
        ([{"dim": 0, "start": 0, "stop": 128}], [{"dim": 0, "axis": "tp"}]),
        ([{"dim": 0, "start": 128, "stop": 192}], [{"dim": 0, "axis": "tp"}]),
        ([{"dim": 0, "start": 192, "stop": 256}], [{"dim": 0, "axis": "tp"}]),
    ]
    w13 = by_local["model.layers.{layer}.mlp.experts.w13_weight"]
    assert (w13["shard"], w13["permute"]) == ([{"dim": 2, "axis": "tp"}], [0, 2, 1])
    # The tensor only the spec had came from the {*} fallback, which the new rule's canonical leaves:
    # nothing is switched off (switching {*} off would drop every other tensor it holds).
    assert not any(r.get("when") is False for r in found.rules)


def test_cli_writes_checked_rules_and_fails_on_what_it_cannot_say(tmp_path: Path) -> None:
    spec, paths = _probes(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "weightbridge", "rules", str(spec), *map(str, paths), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and len(out["rules"]) >= 2
    # A probe whose vocabulary rows are padded and split unevenly: not a rule; reported, exit 1.
    bad = json.loads(paths[1].read_text())
    qkv = next(t for t in bad["tensors"] if t["name"].endswith("0.self_attn.qkv_proj.weight"))
    qkv["pieces"][0]["canonical_box"][0] = [97, 161]
    paths[1].write_text(json.dumps(bad))
    proc = subprocess.run([sys.executable, "-m", "weightbridge", "rules", str(spec), *map(str, paths)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not expressible as a rule: model.layers.0.self_attn.qkv_proj.weight" in proc.stderr
    assert "still different after adding them" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "weightbridge", "rules", str(spec), str(paths[0])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "1 probe(s) for the 2 rollout rank(s)" in proc.stderr


def test_hostile_probe_files_exit_2_or_are_reported(tmp_path: Path, capsys) -> None:
    from weightbridge.cli.main import main

    spec, paths = _probes(tmp_path)

    def rules(*args: str) -> tuple[int, str]:
        rc = main(["rules", str(spec), *args])
        return rc, capsys.readouterr().err

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    notjson = tmp_path / "x.json"
    notjson.write_text("not json")
    for args, fragment in [(["a\0b.json"], "probe .json"), (["a" * 5000 + ".json"], "probe .json"),
                           ([str(notjson), str(notjson)], "not a layout JSON"), ([str(deep), str(deep)], "nested"),
                           ([str(paths[0])] * 5000, "at most 4,096")]:
        rc, err = rules(*args)
        assert rc == 2 and fragment in err and "Traceback" not in err, (fragment, err[-500:])
        assert len(err) < 4000
    # a probe naming a canonical tensor the model lacks: reported, never a crash
    bad = json.loads(paths[0].read_text())
    bad["tensors"][0]["pieces"][0]["canonical"] = "no.such.tensor"
    paths[0].write_text(json.dumps(bad))
    rc, err = rules(*map(str, paths))
    assert rc == 1 and "the model does not have: no.such.tensor" in err, err[-800:]


def test_stacked_experts_from_per_expert_tensors() -> None:
    """vLLM's w13 = stack over experts of [w1; w3] (each split over tp), or experts dealt over the
    ranks (expert parallel): one body with {expert}, and the stack."""
    names = [f"model.layers.0.moe.experts.{e}.{w}.weight" for e in range(4) for w in ("w1", "w3")]
    model = CanonicalModel(tuple(sorted(CanonicalTensor(n, (6, 5), "float32") for n in names)))
    split = {"local": "model.layers.{layer}.moe.w13", "stack": {"count": 4}, "concat": {"dim": 0, "parts": [
        {"canonical": "model.layers.{layer}.moe.experts.{expert}.w1.weight", "shard": "column"},
        {"canonical": "model.layers.{layer}.moe.experts.{expert}.w3.weight", "shard": "column"}]}}
    dealt = {**split, "stack": {"count": 4, "axis": "tp"}, "concat": {"dim": 0, "parts": [
        {"canonical": p["canonical"]} for p in split["concat"]["parts"]]}}
    for truth in (split, dealt):
        ranks = _expand(model, 2, [truth])
        inferred = infer_rules(model, ranks, axis="tp")
        assert inferred.unexplained == ()
        (rule,) = inferred.rules
        assert rule["stack"] == truth["stack"]
        assert [p["canonical"] for p in rule["concat"]["parts"]] == [
            "model.layers.{layer}.moe.experts.{expert}.w1.weight", "model.layers.{layer}.moe.experts.{expert}.w3.weight"]
        again = _expand(model, 2, [rule])
        assert [layout_fingerprint(r) for r in again] == [layout_fingerprint(r) for r in ranks]
