"""Expansion copies geometry between tensors that differ only in their canonical names
(weightbridge/layout/expand.py ``_build_shared``, local_build.py ``_stack_item``), and the spec's
tiling check skips those copies while their originals pass (spec/sides.py). Both must give
exactly what building and checking every tensor gives."""

from __future__ import annotations

import pytest

from weightbridge.canonical import load_canonical
from weightbridge.layout import expand as expand_mod
from weightbridge.layout import local_build
from weightbridge.layout.expand import expand_side
from weightbridge.layout.ir import CanonicalModel
from weightbridge.spec import sides
from weightbridge.spec.models import SideSpec
from weightbridge.spec.sides import side_config

CASES = [  # (bundled model, side, preset, mesh, extra): dense and MoE, TP/PP/EP/ETP, stacked experts
    ("tiny-deepseek-v3", "rollout", "vllm", {"tp": 2, "ep": 2}, {}),
    ("tiny-deepseek-v3", "rollout", "sglang", {"tp": 2, "ep": 2}, {}),
    ("tiny-deepseek-v3", "trainer", "megatron", {"tp": 2, "pp": 2, "ep": 2, "etp": 2, "dp": 2},
     {"pipeline": {"layers": [2, 1]}}),
    ("tiny-qwen3-moe", "rollout", "vllm", {"tp": 2}, {}),
    ("tiny-qwen3-moe", "trainer", "megatron", {"tp": 2, "ep": 2, "dp": 2}, {}),
    ("tiny-qwen2", "rollout", "vllm", {"tp": 2}, {"instances": 2}),
    ("tiny-llama", "trainer", "fsdp2", {"dp": 2, "tp": 2}, {}),
    ("qwen3-30b-a3b", "rollout", "vllm", {"tp": 4, "ep": 4}, {}),
    ("deepseek-v3", "trainer", "megatron", {"pp": 4, "dp": 4, "ep": 4, "etp": 1},
     {"pipeline": {"layers": [16, 15, 15, 15]}}),
]


def _expand(model: CanonicalModel, side: str, preset: str, mesh: dict, extra: dict):
    clones: dict = {}
    layout, problems = expand_side(side_config(side, SideSpec(preset=preset, mesh=mesh, **extra)), model, clones)
    assert not problems, problems
    return layout, clones


def _build_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: every local tensor and every stacked expert built from its rule."""
    monkeypatch.setattr(expand_mod._Expander, "_build_shared",
                        lambda self, cr, b, coords, at, name: self._build(cr.rule, b, coords, name))

    def stack_item(self, rule, names, coords, local, same):
        return self._body(rule, names, coords, local)

    monkeypatch.setattr(local_build.TensorBuilder, "_stack_item", stack_item)


@pytest.mark.parametrize(("model", "side", "preset", "mesh", "extra"), CASES, ids=lambda v: str(v))
def test_shared_geometry_expands_exactly_as_building_every_tensor(model, side, preset, mesh, extra, monkeypatch):
    canonical = load_canonical({"bundled": model})
    shared, clones = _expand(canonical, side, preset, mesh, extra)
    assert clones  # the copies are taken (every case has tensors that differ only in names)
    with monkeypatch.context() as m:
        _build_everything(m)
        built, none = _expand(canonical, side, preset, mesh, extra)
    assert not none
    assert shared == built


def test_a_tiling_problem_is_reported_for_every_tensor_as_a_full_check_would(monkeypatch) -> None:
    """When an original has a problem, its copies are checked too, in the full pass's order."""
    canonical = load_canonical({"bundled": "tiny-qwen3-moe"})
    spec_side = SideSpec(preset="vllm", mesh={"tp": 2})
    flagged = "mlp.experts"  # every stacked expert tensor (and a copy of one): a fake problem each

    def fake_tiling(t, model=None):
        return [f"{t.name}: fake"] if flagged in t.name else []

    monkeypatch.setattr(sides, "tiling_problems", fake_tiling)
    layout, clones = _expand(canonical, "rollout", "vllm", {"tp": 2}, {})
    skipped = sides._tiling(layout, canonical, skip=clones)
    full = sides._tiling(layout, canonical, skip={})
    assert skipped and len(full) >= len(skipped)

    class Col:
        def __init__(self):
            self.problems = []

        def add(self, path, message, hint="", line=None):
            self.problems.append((path, message))

    col = Col()
    assert sides.side_pass("rollout", spec_side, canonical, col) is not None
    assert [m for _, m in col.problems] == full
