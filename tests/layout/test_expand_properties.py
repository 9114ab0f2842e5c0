"""Properties of preset expansion, checked by materialising the layouts.

For random meshes of every preset on the bundled tiny models, every canonical
tensor is filled with distinct ids and every rank's local tensors are built from
their pieces (see ``_materialise``). Then:

(a) no local element is written twice, and within a rank every canonical element
    lands in at most one local element (tied embeddings aside);
(b) the trainer's ranks, and the ranks of each rollout instance, hold every
    canonical element, each the same number of times (uniform replication);
(c) expansion is deterministic (same layouts, same ``layout_hash``, across
    processes too) and the JSON form round-trips;
(d) local elements no piece writes exist only in tensors of padding rules, as
    trailing whole rows (vocabulary padding).

Invalid meshes must yield problems rather than a layout. The last section pins
preset behaviour against the frameworks it models (bugs found are failing tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from functools import cache
from math import prod
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from weightbridge.layout.coverage import tiling_problems, uncovered
from weightbridge.layout.expand import SideConfig
from weightbridge.layout.ir import CanonicalModel, RankLayout, SideLayout
from weightbridge.layout.mesh import stage_layers

from ._materialise import (
    TINY_MODELS,
    UNWRITTEN,
    CanonicalIds,
    build,
    coverage_counts,
    materialise_rank,
    padded_local_patterns,
    tiny_model,
    unique_layouts,
)

PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def ids_of(name: str) -> CanonicalIds:
    return CanonicalIds.of(tiny_model(name))


def params(name: str) -> dict:
    return tiny_model(name).param_dict


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def check_layout(side: str, preset: str, mesh: dict, model_name: str, instances: int = 1, **spec) -> None:
    model = tiny_model(model_name)
    cfg, layout, problems = build(side, preset, mesh, model, instances, **spec)
    label = f"{preset} {mesh} x{instances} {spec or ''} on {model_name}"
    assert problems == [], f"{label}: {[p.message for p in problems]}"
    check_expanded(cfg, layout, model, ids_of(model_name), label)
    # (c) determinism and JSON round trip
    _, again, problems2 = build(side, preset, mesh, model, instances, **spec)
    assert problems2 == []
    assert again.ranks == layout.ranks
    assert again.digest() == layout.digest()
    for rank, _ in unique_layouts(layout.ranks):
        assert RankLayout.from_json(json.loads(json.dumps(rank.to_json()))) == rank


def check_expanded(cfg: SideConfig, layout: SideLayout, model: CanonicalModel, canon: CanonicalIds, label: str) -> None:
    """Properties (a), (b), (d) of one expanded side (``label`` names it in messages)."""
    side, mesh, instances = cfg.side, dict(cfg.mesh), cfg.instances
    assert layout.ranks, "a valid mesh must give ranks"
    per_instance = cfg.family.world_size(mesh)
    assert layout.world_size == per_instance * instances
    assert [r.rank for r in layout.ranks] == list(range(layout.world_size))

    tied = bool(model.param_dict.get("tie_word_embeddings"))
    may_repeat = {"model.embed_tokens.weight"} if tied else set()
    pads = padded_local_patterns(cfg)
    built: dict = {}

    # (a) per rank: pieces fit, no local element written twice, no canonical element held twice
    for rank, _ in unique_layouts(layout.ranks):
        arrays = materialise_rank(rank, canon)  # asserts bounds, sizes and no double write
        built[id(rank.tensors)] = arrays
        held = []
        for t in rank.tensors:
            assert tiling_problems(t, model) == [], f"rank {rank.rank}: {tiling_problems(t, model)}"
            vals = arrays[t.name][arrays[t.name] != UNWRITTEN]
            uniq = np.unique(vals)
            assert uniq.size == vals.size, f"rank {rank.rank}: {t.name} holds a canonical element twice"
            held.append(uniq)
        if held:
            allv = np.concatenate(held)
            u, c = np.unique(allv, return_counts=True)
            twice = set(canon.owner(u[c > 1])) if (c > 1).any() else set()
            assert twice <= may_repeat, f"rank {rank.rank} holds {sorted(twice)} in two local tensors"

    # (b) coverage: trainer as a whole, each rollout instance on its own
    if side == "trainer":
        groups = [layout.ranks]
    else:
        groups = [layout.instance_ranks(i) for i in range(instances)]
        first = layout.instance_ranks(0)
        for i in range(1, instances):
            other = layout.instance_ranks(i)
            assert [r.tensors for r in other] == [r.tensors for r in first], "instances differ"
            assert [r.local_rank for r in other] == list(range(per_instance))
    for group in groups:
        counts = coverage_counts(group, canon, built)
        for t in model.tensors:
            off = canon.offsets[t.name]
            c = counts[off : off + prod(t.shape)]
            assert c.min() >= 1, f"{label}: {t.name}: {(c == 0).sum()} elements held by no rank"
            assert c.min() == c.max(), f"{label}: {t.name} held {c.min()}..{c.max()} times (partial overlap)"
        assert uncovered(model, group) == {}

    # (d) unwritten local elements: only in padding rules' tensors, as trailing whole rows
    for arrays in built.values():
        for name, a in arrays.items():
            mask = a == UNWRITTEN
            if not mask.any():
                continue
            assert any(p.match(name) for p in pads), (
                f"{name}: {mask.sum()} unwritten elements, but its rule does not pad"
            )
            rows = mask.reshape(a.shape[0], -1)
            full = rows.all(axis=1)
            assert (rows.any(axis=1) == full).all(), f"{name}: padding is not whole rows"
            first_pad = int(np.argmax(full))
            assert full[first_pad:].all() and not full[:first_pad].any(), f"{name}: padding rows are not trailing"


# ---------------------------------------------------------------------------------------------
# Valid meshes
# ---------------------------------------------------------------------------------------------

models = st.sampled_from(TINY_MODELS)


@st.composite
def stage_sizes(draw, layers: int, pp: int):
    """Layers per stage, each at least one, summing to ``layers``."""
    cuts = sorted(draw(st.lists(st.integers(1, layers - 1), min_size=pp - 1, max_size=pp - 1, unique=True)))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


@st.composite
def megatron_mesh(draw):
    name = draw(models)
    p = params(name)
    # Megatron needs tp | num_query_groups (GQA) and tp | num_heads (MLA)
    groups = p["num_kv_heads"] if p.get("q_lora_rank", 0) == 0 and p.get("kv_lora_rank", 0) == 0 else p["num_heads"]
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if groups % d == 0]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    pp = draw(st.integers(1, p["num_layers"]))
    spec = {}
    if pp > 1 and (p["num_layers"] % pp or draw(st.booleans())):
        spec["pipeline"] = {"layers": draw(stage_sizes(p["num_layers"], pp))}  # uneven stages, given explicitly
    mesh = {"tp": tp, "dp": dp, "pp": pp}
    if cp > 1:
        mesh["cp"] = cp
    assume(tp * cp * dp * pp <= 64)
    dense = tp * cp * dp
    etp = draw(st.sampled_from([None, 1, tp]))
    e = tp if etp is None else etp
    experts = p.get("num_experts", 0) or 8
    eps = [d for d in divisors(experts) if dense % (e * d) == 0]
    ep = draw(st.sampled_from(eps))
    if ep > 1:
        mesh["ep"] = ep
    if etp is not None:
        mesh["etp"] = etp
    return name, mesh, spec


@st.composite
def fsdp2_mesh(draw):
    name = draw(models)
    mesh = {"dp": draw(st.integers(1, 8)), "tp": draw(st.sampled_from([1, 2, 4, 8]))}
    if draw(st.booleans()):
        mesh["dp_replicate"] = draw(st.integers(1, 2))
    if draw(st.booleans()):
        mesh["cp"] = 2
    assume(prod(mesh.values()) <= 64)  # keeps each example well under a second
    return name, mesh


@st.composite
def engine_mesh(draw, preset):
    name = draw(models)
    p = params(name)
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    mesh = {"tp": tp, "pp": draw(st.integers(1, p["num_layers"]))}
    # vLLM: ep = 1 or tp; SGLang: any divisor of tp (moe_tp = tp / ep)
    ep = draw(st.sampled_from([1, tp] if preset == "vllm" else divisors(tp)))
    if ep > 1:
        mesh["ep"] = ep
    spec = {}
    if mesh["pp"] > 1 and draw(st.booleans()):
        spec["pipeline"] = {"layers": draw(stage_sizes(p["num_layers"], mesh["pp"]))}
    return name, mesh, draw(st.integers(1, 3)), spec


@PROPS
@given(megatron_mesh())
def test_megatron_layouts(case):
    name, mesh, spec = case
    check_layout("trainer", "megatron", mesh, name, **spec)


@PROPS
@given(fsdp2_mesh())
def test_fsdp2_layouts(case):
    name, mesh = case
    check_layout("trainer", "fsdp2", mesh, name)


@settings(max_examples=8, deadline=None)
@given(models, st.integers(1, 3))
def test_hf_layouts(name, dp):
    check_layout("trainer", "hf", {"dp": dp}, name)


@PROPS
@given(engine_mesh("vllm"))
def test_vllm_layouts(case):
    name, mesh, instances, spec = case
    check_layout("rollout", "vllm", mesh, name, instances, **spec)


@PROPS
@given(engine_mesh("sglang"))
def test_sglang_layouts(case):
    name, mesh, instances, spec = case
    check_layout("rollout", "sglang", mesh, name, instances, **spec)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_spec_example_meshes(name):
    """The meshes of spec/examples on each tiny model (fixed, so they run on every invocation)."""
    check_layout("trainer", "fsdp2", {"dp": 2}, name)
    check_layout("trainer", "fsdp2", {"dp": 8, "tp": 2}, name)
    check_layout("rollout", "vllm", {"tp": 2}, name, instances=2)
    check_layout("rollout", "vllm", {"tp": 4, "ep": 4}, name, instances=2)
    p = params(name)
    if p["num_layers"] % 2 == 0:
        check_layout("trainer", "megatron", {"tp": 2, "pp": 2, "dp": 2}, name)
    check_layout("trainer", "megatron", {"tp": 2, "dp": 8, "ep": 8, "etp": 1}, name)


def test_tiny_spec_example_resolves_and_tiles():
    """spec/examples/tiny_fsdp2_to_vllm.yaml through check_spec, then the same properties."""
    from weightbridge.spec.resolve import check_spec
    from weightbridge.spec.sides import side_config

    path = Path(__file__).resolve().parents[2] / "spec" / "examples" / "tiny_fsdp2_to_vllm.yaml"
    resolved, problems = check_spec(path)
    assert problems == [] and resolved is not None
    canon = CanonicalIds.of(resolved.canonical)
    for side in ("trainer", "rollout"):
        cfg = side_config(side, getattr(resolved.spec, side))
        check_expanded(cfg, resolved.side(side), resolved.canonical, canon, f"{path.name} {side}")
    assert resolved.rollout.num_instances == 2 and resolved.rollout.world_size == 4


def test_layout_hash_stable_across_processes():
    """layout_hash must not depend on the process (hash seeds, dict order)."""
    cases = [
        ("tiny-qwen3-moe", "trainer", "megatron", {"tp": 2, "dp": 4, "ep": 4, "pp": 2}, 1),
        ("tiny-deepseek-v3", "rollout", "vllm", {"tp": 4, "ep": 4, "pp": 2}, 2),
        ("tiny-llama", "trainer", "fsdp2", {"dp": 3, "tp": 2}, 1),
        ("tiny-qwen2", "rollout", "sglang", {"tp": 8}, 1),
    ]
    payload = []
    here = []
    for name, side, preset, mesh, inst in cases:
        m = tiny_model(name)
        _, lay, probs = build(side, preset, mesh, m, inst)
        assert probs == []
        here.append(lay.digest())
        payload.append(
            {
                "tensors": [[t.name, list(t.shape), t.dtype] for t in m.tensors],
                "params": [list(kv) for kv in m.params],
                "side": side,
                "preset": preset,
                "mesh": mesh,
                "instances": inst,
            }
        )
    script = textwrap.dedent(
        """
        import json, sys
        from weightbridge.layout.expand import expand_side
        from weightbridge.layout.ir import CanonicalModel, CanonicalTensor
        from weightbridge.spec.models import SideSpec
        from weightbridge.spec.sides import side_config
        out = []
        for c in json.load(sys.stdin):
            m = CanonicalModel(tuple(CanonicalTensor(n, tuple(s), d) for n, s, d in c["tensors"]),
                               tuple((k, v) for k, v in c["params"]))
            cfg = side_config(c["side"], SideSpec(preset=c["preset"], mesh=c["mesh"], instances=c["instances"]))
            lay, probs = expand_side(cfg, m)
            assert not probs, probs
            out.append(lay.digest())
        print(json.dumps(out))
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digests = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        res = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps(payload),
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        digests.append(json.loads(res.stdout))
    assert digests[0] == digests[1] == here


# ---------------------------------------------------------------------------------------------
# Invalid meshes: problems, not a layout
# ---------------------------------------------------------------------------------------------

INVALID = [
    ("tiny-llama", "trainer", "megatron", {"tp": 3}, "tp"),
    ("tiny-llama", "trainer", "megatron", {"pp": 3}, "pp"),
    ("tiny-deepseek-v3", "trainer", "megatron", {"pp": 2}, "pp"),
    ("tiny-qwen3-moe", "trainer", "megatron", {"dp": 3, "ep": 3, "etp": 1}, "ep"),
    ("tiny-qwen3-moe", "trainer", "megatron", {"tp": 2, "dp": 2, "ep": 4}, "ep"),  # etp*ep = 8 > 4 ranks
    ("tiny-llama", "trainer", "megatron", {"tp": 2, "sp": 2}, "sp"),
    ("tiny-llama", "trainer", "fsdp2", {"tp": 3}, "tp"),
    ("tiny-qwen2", "trainer", "fsdp2", {"dp": 2, "ep": 2}, "ep"),
    ("tiny-llama", "trainer", "hf", {"tp": 2}, "tp"),
    ("tiny-llama", "rollout", "vllm", {"tp": 3}, "tp"),
    ("tiny-qwen3-moe", "rollout", "vllm", {"tp": 4, "ep": 2}, "ep"),
    ("tiny-qwen3-moe", "rollout", "sglang", {"tp": 4, "ep": 3}, "ep"),
    ("tiny-qwen3-moe", "rollout", "sglang", {"tp": 8, "ep": 8 * 2}, "ep"),
    ("tiny-llama", "rollout", "vllm", {"dp": 2}, "dp"),
]


@pytest.mark.parametrize("name, side, preset, mesh, axis", INVALID, ids=lambda x: str(x))
def test_invalid_mesh_yields_problems(name, side, preset, mesh, axis):
    _, _, problems = build(side, preset, mesh, tiny_model(name))
    assert problems, f"{preset} {mesh} on {name} should be rejected"
    if axis:
        assert any(p.axis == axis for p in problems), [(p.axis, p.message) for p in problems]


@PROPS
@given(models, st.sampled_from(["megatron", "fsdp2", "vllm", "sglang"]), st.sampled_from([3, 5, 6, 7]))
def test_tp_not_dividing_heads_yields_problems(name, preset, tp):
    side = "rollout" if preset in ("vllm", "sglang") else "trainer"
    _, _, problems = build(side, preset, {"tp": tp}, tiny_model(name))
    assert problems and any(p.axis == "tp" for p in problems)


# ---------------------------------------------------------------------------------------------
# Preset fidelity (each of these pins a behaviour of the modelled framework)
# ---------------------------------------------------------------------------------------------


def _names(rank: RankLayout) -> set[str]:
    return {t.name for t in rank.tensors}


def test_hf_tied_embeddings_keep_embed_tokens():
    """hf preset doc: with tied embeddings lm_head.weight is a *second* local tensor.

    A HF model's state dict holds both model.embed_tokens.weight and lm_head.weight.
    """
    model = tiny_model("tiny-qwen2")
    assert model.param_dict["tie_word_embeddings"]
    _, layout, problems = build("trainer", "hf", {"dp": 1}, model)
    assert problems == []
    names = _names(layout.ranks[0])
    assert "lm_head.weight" in names
    assert "model.embed_tokens.weight" in names, "the embedding itself is missing from the hf layout"


def test_vllm_tied_embeddings_last_pp_stage_holds_embed_tokens():
    """vLLM (Qwen2Model / LlamaModel) builds embed_tokens on the first PP rank *and*, with
    tie_word_embeddings, on the last PP rank (its lm_head is that module). The last
    stage's copy must be in the layout, or it is never updated."""
    model = tiny_model("tiny-qwen2")
    _, layout, problems = build("rollout", "vllm", {"tp": 2, "pp": 2}, model)
    assert problems == []
    by_stage = {dict(r.coords)["pp"]: _names(r) for r in layout.ranks}
    assert "model.embed_tokens.weight" in by_stage[0]
    assert "model.embed_tokens.weight" in by_stage[1], "last PP stage (tied lm_head) holds no embedding"


def test_megatron_tp_beyond_query_groups_is_a_problem():
    """Megatron-Core requires num_query_groups % tp == 0. With tp = 8 > num_kv_heads = 4
    the preset replicates whole query groups over tp pairs while linear_proj is still
    split 8 ways, so a rank's QKV heads and its linear_proj columns disagree."""
    model = tiny_model("tiny-qwen2")
    assert model.param_dict["num_kv_heads"] == 4
    _, layout, problems = build("trainer", "megatron", {"tp": 8}, model)
    if not problems:
        r1 = layout.ranks[1]
        qkv = r1.tensor("decoder.layers.0.self_attention.linear_qkv.weight")
        proj = r1.tensor("decoder.layers.0.self_attention.linear_proj.weight")
        q_rows = next(p.canonical_box[0] for p in qkv.pieces if p.canonical.endswith("q_proj.weight"))
        o_cols = proj.pieces[0].canonical_box[1]
        pytest.fail(f"no problem for tp=8 > num_kv_heads=4; rank 1 holds q rows {q_rows} but o_proj columns {o_cols}")


def test_vllm_tp_beyond_num_heads_is_a_problem():
    """vLLM requires num_heads % tp == 0 (only KV heads may be replicated). With tp = 16 >
    num_heads = 8 the preset replicates query heads and o_proj columns, which a
    row-parallel all-reduce would count twice."""
    model = tiny_model("tiny-qwen2")
    assert model.param_dict["num_heads"] == 8
    _, _, problems = build("rollout", "vllm", {"tp": 16}, model)
    assert problems and any(p.axis == "tp" for p in problems)


@pytest.mark.parametrize("pp", [2, 3])
def test_vllm_stage_layers_follow_get_pp_indices(pp):
    """vLLM get_pp_indices: the remainder goes one layer each to the stages before the last."""
    model = tiny_model("tiny-deepseek-v3")  # 3 layers
    _, layout, problems = build("rollout", "vllm", {"pp": pp}, model)
    assert problems == []
    want = stage_layers(3, pp, None, "vllm")
    for r in layout.ranks:
        stage = dict(r.coords)["pp"]
        layers = {int(n.split(".")[2]) for n in _names(r) if n.startswith("model.layers.")}
        assert layers == set(want[stage])
    assert [len(x) for x in want] == ([2, 1] if pp == 2 else [1, 1, 1])
