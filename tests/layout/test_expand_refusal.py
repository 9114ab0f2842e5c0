"""A side whose sizes do not fit the model is refused after expanding its representative ranks only.

``expand_side`` first expands the first rank of each pipeline stage and expert slice; when those
have problems it searches the other ranks only with the rules whose problems can depend on the
shard coordinates (``uneven`` steps). The properties: the problems reported are exactly those a
full expansion of every rank reports (random meshes of every preset, and random custom rules with
uneven steps, concat and stacking), and a refused side expands only its representatives.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from weightbridge.canonical import load_canonical
from weightbridge.layout import expand as expand_mod
from weightbridge.layout.expand import SideConfig, expand_side
from weightbridge.layout.mesh import custom_family
from weightbridge.layout.rules import Rule
from weightbridge.spec.models import SideSpec
from weightbridge.spec.sides import side_config

from ._materialise import TINY_MODELS, tiny_model

PROPS = settings(max_examples=int(os.environ.get("WB_REFUSAL_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def full_expansion(cfg: SideConfig, model):
    """The expansion of every rank (each distinct coordinate tuple a representative): the reference."""
    every_axis = set(cfg.family.sizes(cfg.mesh)) | set(cfg.family.user_axes)
    with mock.patch.object(expand_mod, "_selector_axes", lambda compiled: every_axis):
        return expand_side(cfg, model)


def assert_same_as_full(cfg: SideConfig, model) -> None:
    layout, problems = expand_side(cfg, model)
    full_layout, full_problems = full_expansion(cfg, model)
    assert set(problems) == set(full_problems), (set(full_problems) - set(problems), set(problems) - set(full_problems))
    assert len(problems) == len(set(problems))
    if not problems:
        assert layout == full_layout


sizes = st.sampled_from([1, 2, 3, 4, 5, 6, 8, 16])


@st.composite
def preset_side(draw):
    preset = draw(st.sampled_from(["megatron", "fsdp2", "vllm", "sglang", "hf"]))
    axes = {"megatron": ["tp", "pp", "dp", "ep", "etp", "cp"], "fsdp2": ["tp", "dp", "cp", "dp_replicate"],
            "vllm": ["tp", "pp", "ep"], "sglang": ["tp", "pp", "ep"], "hf": ["dp"]}[preset]
    mesh = {a: draw(sizes) for a in draw(st.lists(st.sampled_from(axes), unique=True, max_size=4))}
    world = 1
    for v in mesh.values():
        world *= v
    side = "rollout" if preset in ("vllm", "sglang", "hf") else "trainer"
    instances = draw(st.integers(1, 2)) if side == "rollout" else 1
    return draw(st.sampled_from(TINY_MODELS)), side, preset, mesh, instances, world


@PROPS
@given(preset_side())
def test_preset_sides_report_what_a_full_expansion_reports(case) -> None:
    name, side, preset, mesh, instances, world = case
    if world > 128:  # keeps the reference expansion fast; the refusal itself is what is being checked
        return
    cfg = side_config(side, SideSpec(preset=preset, mesh=mesh, instances=instances))
    assert_same_as_full(cfg, tiny_model(name))


# A small inline model: two layers of two 2-D weights (10 and 9 columns: uneven chunks over 4 ranks agree on
# rank 0, 3 columns each, and differ on rank 3) and a bias, and 4 experts per layer (the last one 9 columns wide).
INLINE = {"tensors": [
    *[{"name": f"model.layers.{i}.w.weight", "shape": [12, 10], "dtype": "bfloat16"} for i in range(2)],
    *[{"name": f"model.layers.{i}.v.weight", "shape": [8, 9], "dtype": "bfloat16"} for i in range(2)],
    *[{"name": f"model.layers.{i}.b.bias", "shape": [12], "dtype": "bfloat16"} for i in range(2)],
    *[{"name": f"model.layers.{i}.experts.{e}.up.weight", "shape": [6, 10 if e < 3 else 9], "dtype": "bfloat16"}
      for i in range(2) for e in range(4)],
]}


@st.composite
def shard_steps(draw, ndim: int):
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        step = {"dim": draw(st.integers(0, ndim - 1)), "axis": draw(st.sampled_from(["tp", "dp", "ep"]))}
        if draw(st.booleans()):
            step["uneven"] = True
        if draw(st.integers(0, 3)) == 0:
            step["blocks"] = draw(st.sampled_from([2, 3, 4]))
            step["replicate"] = draw(st.booleans())
        steps.append(step)
    return steps


@st.composite
def custom_side(draw):
    rules = [
        {"local": "layers.{layer}.wb", "concat": {"dim": 0, "parts": [
            {"canonical": "model.layers.{layer}.w.weight", "shard": draw(shard_steps(2))},
            {"canonical": "model.layers.{layer}.v.weight", "shard": draw(shard_steps(2))},
        ]}} if draw(st.booleans()) else
        {"local": "layers.{layer}.w", "canonical": "model.layers.{layer}.w.weight", "shard": draw(shard_steps(2))},
        {"local": "layers.{layer}.b", "canonical": "model.layers.{layer}.b.bias", "shard": draw(shard_steps(1))},
    ]
    if draw(st.booleans()):
        rules.append({"local": "layers.{layer}.experts.up", "canonical": "model.layers.{layer}.experts.{expert}.up.weight",
                      "stack": {"count": 4, "axis": "ep"}, "shard": draw(shard_steps(2))})
    else:
        rules.append({"local": "layers.{layer}.experts.{local_expert}.up",
                      "canonical": "model.layers.{layer}.experts.{expert}.up.weight", "shard": draw(shard_steps(2))})
    if draw(st.booleans()):  # an uneven step, then another on the same dim (FSDP2 on top of a shard)
        dim = draw(st.integers(0, 1))
        rules.append({"local": "layers.{layer}.v", "canonical": "model.layers.{layer}.v.weight",
                      "shard": [{"dim": dim, "axis": "tp", "uneven": True}, {"dim": dim, "axis": "dp"}]})
    mesh = {"tp": draw(sizes), "dp": draw(sizes), "ep": draw(st.sampled_from([1, 2, 3, 4]))}
    return [Rule.model_validate(r) for r in rules], mesh


def _case(*rules: dict, tp: int = 4, dp: int = 1, ep: int = 1) -> tuple[list[Rule], dict[str, int]]:
    """``rules`` plus one that fails on every rank (12 bias rows in 5 blocks): the side is refused at its
    representatives, so ``rules``' problems on other ranks are found only by the search for them."""
    fails = [{"local": "layers.{layer}.b", "canonical": "model.layers.{layer}.b.bias",
              "shard": [{"dim": 0, "axis": "tp", "blocks": 5}]}]
    return [Rule.model_validate(r) for r in (*rules, *fails)], {"tp": tp, "dp": dp, "ep": ep}


UNEVEN_COLUMNS = [{"dim": 1, "axis": "tp", "uneven": True}]  # 10 and 9 columns over tp=4: 3,3,3,1 and 3,3,3,0


@PROPS
@given(custom_side())
@example(_case({"local": "layers.{layer}.wv", "concat": {"dim": 0, "parts": [  # parts agree on rank 0 only
    {"canonical": "model.layers.{layer}.w.weight", "shard": UNEVEN_COLUMNS},
    {"canonical": "model.layers.{layer}.v.weight", "shard": UNEVEN_COLUMNS}]}}))
@example(_case({"local": "layers.{layer}.up", "canonical": "model.layers.{layer}.experts.{expert}.up.weight",
                "stack": {"count": 4, "axis": "ep"}, "shard": UNEVEN_COLUMNS}))  # experts agree on rank 0 only
@example(_case({"local": "layers.{layer}.v", "canonical": "model.layers.{layer}.v.weight",  # 3,3,3,0 rows over dp 3
                "shard": [*UNEVEN_COLUMNS, {"dim": 1, "axis": "dp"}]}, dp=3))
@example(_case({"local": "layers.{layer}.experts.{local_expert}.up", "shard": [{"dim": 1, "axis": "tp"}],
                "canonical": "model.layers.{layer}.experts.{expert}.up.weight"}, ep=2))  # experts 2, 3: on ep rank 1
def test_custom_rules_with_uneven_steps_report_what_a_full_expansion_reports(case) -> None:
    rules, mesh = case
    model = inline_model()
    cfg = SideConfig(side="trainer", family=custom_family(("tp", "dp", "ep")), mesh=mesh,
                     rules=[(r, expand_mod.Origin("spec", i)) for i, r in enumerate(rules)])
    assert_same_as_full(cfg, model)


_INLINE = []


def inline_model():
    if not _INLINE:
        _INLINE.append(load_canonical(INLINE, "."))
    return _INLINE[0]


def test_a_refused_side_expands_its_representative_ranks_only() -> None:
    """Qwen3-235B under Megatron with tp 1024 (its 4 query groups cannot be dealt over 1024 ranks):
    refused after expanding one of its 1024 ranks, with every problem the full expansion has."""
    model = load_canonical({"bundled": "qwen3-235b-a22b"}, ".")
    cfg = side_config("trainer", SideSpec(preset="megatron", mesh={"tp": 1024}))
    calls: list[dict] = []
    real = expand_mod._Expander.expand_rank

    def counting(self, coords, *args, **kwargs):
        calls.append(dict(coords))
        return real(self, coords, *args, **kwargs)

    with mock.patch.object(expand_mod._Expander, "expand_rank", counting):
        layout, problems = expand_side(cfg, model)
    assert layout.ranks == ()
    assert len(calls) == 1 and calls[0]["tp"] == 0
    assert any(p.axis == "tp" and p.message.endswith("groups: 4 blocks of dim 0 are fewer than tp=1024 ranks")
               for p in problems)
    assert any("is not divisible by etp=1024" in p.message and p.axis == "etp" for p in problems)


@pytest.mark.parametrize("mesh", [{"tp": 4, "pp": 2, "ep": 8, "etp": 1, "dp": 2}, {"tp": 2, "dp": 2, "ep": 4, "etp": 1}])
def test_a_valid_side_is_expanded_in_full(mesh) -> None:
    """The representatives' expansions are reused, not repeated, and the rest of the ranks follow."""
    model = tiny_model("tiny-qwen3-moe")
    cfg = side_config("trainer", SideSpec(preset="megatron", mesh=mesh))
    layout, problems = expand_side(cfg, model)
    assert problems == []
    full_layout, _ = full_expansion(cfg, model)
    assert layout == full_layout
