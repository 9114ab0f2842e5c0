"""transformers 5's fused MoE experts under FSDP2, observed: issue 33's FSDP2 Qwen3-MoE trainer side.

transformers 5 holds each MoE layer's experts fused (``mlp.experts.gate_up_proj [E, 2I, H]``,
``mlp.experts.down_proj [E, H, I]``) where the checkpoint has one tensor per expert; the probe reads
how from transformers' own conversion mapping (:mod:`weightbridge.probe.fused`). Its DTensor layout of
a live ``fully_shard`` world must equal the ``fsdp2`` preset's expansion, and a drafted spec fitted to
the live ranks must reproduce them (in-process and through ``weightbridge fit`` / ``diff``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st


def _why_not() -> str | None:
    """Why this transformers cannot run these tests (None: it can)."""
    try:
        import transformers
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping  # noqa: F401
        from transformers.core_model_loading import MergeModulelist  # noqa: F401
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeForCausalLM

        from ._fused_world import tiny_config
    except ImportError as exc:
        return f"transformers without its conversion mapping or Qwen3-MoE ({exc})"
    with torch.device("meta"):
        names = {n for n, _ in Qwen3MoeForCausalLM(tiny_config()).named_parameters()}
    if "model.layers.0.mlp.experts.gate_up_proj" not in names:
        return f"transformers {transformers.__version__} keeps Qwen3-MoE experts unfused"
    return None


WHY = _why_not()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs transformers >= 5 with fused MoE experts: {WHY} "
                                                        "(pip install 'transformers>=5')")

from weightbridge.layout.ir import LocalTensor, RankLayout  # noqa: E402
from weightbridge.probe.diff import diff_layouts, format_diff  # noqa: E402
from weightbridge.probe.dtensor import layout_from_dtensors  # noqa: E402
from weightbridge.probe.fused import FusedError, FusedParam, fused_params, fused_pieces  # noqa: E402
from weightbridge.spec.resolve import check_text  # noqa: E402
from weightbridge.tensors import diff_tensors, materialize  # noqa: E402

L0 = "model.layers.0.mlp.experts"


def _spec(config: Path, dp: int, fused: bool) -> str:
    return (f"version: 1\nmodel: {{config: {config}}}\ntrainer: {{preset: fsdp2, mesh: {{dp: {dp}}}, "
            f"params: {{fused_experts: {str(fused).lower()}}}}}\nrollout: {{preset: vllm, mesh: {{tp: 1}}}}\n")


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    from ._fused_world import tiny_config

    d = tmp_path_factory.mktemp("qwen3moe")
    tiny_config().save_pretrained(d)
    return d


def test_fused_params_read_from_transformers_mapping() -> None:
    """Qwen3-MoE: transformers' MergeModulelist(0) + Concatenate(1) of gate/up, MergeModulelist(0) of
    down; Mixtral's renaming block_sparse_moe -> mlp undone; no mapping, nothing fused."""
    shapes = {f"{L0}.gate_up_proj": (4, 64, 64), f"{L0}.down_proj": (4, 64, 32),
              "model.layers.0.mlp.gate.weight": (4, 64)}
    got = fused_params("qwen3_moe", shapes)
    assert got == {
        f"{L0}.gate_up_proj": FusedParam(f"{L0}.gate_up_proj", (f"{L0}.{{expert}}.gate_proj.weight",
                                                                 f"{L0}.{{expert}}.up_proj.weight"), 0, 1, (4, 64, 64)),
        f"{L0}.down_proj": FusedParam(f"{L0}.down_proj", (f"{L0}.{{expert}}.down_proj.weight",), 0, None, (4, 64, 32)),
    }
    mixtral = fused_params("mixtral", shapes)
    assert mixtral[f"{L0}.gate_up_proj"].parts == ("model.layers.0.block_sparse_moe.experts.{expert}.w1.weight",
                                                   "model.layers.0.block_sparse_moe.experts.{expert}.w3.weight")
    assert fused_params("llama", shapes) == {}


def test_an_operation_not_interpreted_is_refused_naming_parameter_and_operation() -> None:
    """Qwen3-VL-MoE's mapping transposes the fused experts: not read, refused."""
    with pytest.raises(FusedError, match=r"^model\.layers\.0\.mlp\.experts\.gate_up_proj: .*Transpose"):
        fused_params("qwen3_vl_moe", {f"{L0}.gate_up_proj": (4, 64, 64)})
    with pytest.raises(FusedError, match=r"not split evenly into 2 parts"):
        fused_params("qwen3_moe", {f"{L0}.gate_up_proj": (4, 63, 64)})


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fused_pieces_replay_any_held_indices(data) -> None:
    """Property: for any indices a rank holds along each dim (any order, gaps), the pieces copy each
    local element from its expert's part at the right place."""
    e, parts, rows, cols = (data.draw(st.integers(1, n)) for n in (4, 3, 3, 3))
    fp = FusedParam("w", tuple(f"x.{{expert}}.p{i}" for i in range(parts)), 0, 1, (e, parts * rows, cols))
    per_dim = [data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)) for n in fp.shape]
    full = torch.arange(float(e * parts * rows * cols)).reshape(fp.shape)
    canon = {fp.canonical(p, x): full[x, p * rows:(p + 1) * rows] for x in range(e) for p in range(parts)}
    local = LocalTensor("w", tuple(map(len, per_dim)), "float32", tuple(fused_pieces(fp, per_dim)))
    lay = RankLayout("trainer", 0, (local,))
    want = full[torch.tensor(per_dim[0])][:, torch.tensor(per_dim[1])][:, :, torch.tensor(per_dim[2])]
    assert torch.equal(materialize(lay, canon)["w"], want)


@pytest.mark.parametrize("dp", [2, 3])
def test_fake_mesh_fused_experts_match_the_preset(dp: int, config_dir: Path) -> None:
    """Every rank of dp 2 and 3 (uneven: experts dealt 2, 2, 0) in this process: the probed IR equals
    the fsdp2 preset's fused_experts expansion, and replaying it from the checkpoint tensors
    (transformers' own reverse conversion) gives to_local() bitwise."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import Qwen3MoeForCausalLM

    from ._fused_world import checkpoint_tensors, tiny_config

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(tiny_config())
    full, ckpt = dict(model.named_parameters()), checkpoint_tensors(model)
    fused = fused_params("qwen3_moe", {n: p.shape for n, p in full.items()})
    want, problems = check_text(_spec(config_dir / "config.json", dp, True))
    assert not problems
    for rank in range(dp):
        mesh = DeviceMesh("cpu", torch.arange(dp), mesh_dim_names=("dp",), _init_backend=False, _rank=rank)
        params = {n: distribute_tensor(p.detach(), mesh, (Shard(0),), src_data_rank=None) for n, p in full.items()}
        lay = layout_from_dtensors(params, rank=rank, fused=fused)
        d = diff_layouts(lay, want.trainer.ranks[rank])
        assert not d, f"rank {rank}\n{format_diff(d)}"
        assert diff_tensors(materialize(lay, ckpt), {n: p.to_local() for n, p in params.items()}) == []


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with Gloo")
def test_a_draft_fitted_to_live_fsdp2_qwen3_moe_ranks_reproduces_them(config_dir: Path, tmp_path: Path) -> None:
    """Issue 33: the FSDP2 Qwen3-MoE trainer side observed live (real fully_shard on a Gloo world of
    dp 2) and a drafted spec fitted to it: fused_experts chosen true, every rank's expansion equal to
    the live one, pinned; the same through `weightbridge fit` and `weightbridge diff` (exit 0)."""
    from weightbridge.localrun import launch
    from weightbridge.ops.draft import draft_spec
    from weightbridge.ops.live_fit import fit_side
    from weightbridge.testing._internal.fit_cli import fit_and_diff_cli

    from ._fused_world import run_rank

    dp, store = 2, str(tmp_path / "store")
    results = launch(run_rank, [(r, store, dp, str(config_dir)) for r in range(dp)], timeout_s=120,
                     preload=["transformers", "transformers.models.qwen3_moe.modeling_qwen3_moe"])
    outs = [r.unwrap() for r in results]
    for rank, out in enumerate(outs):
        assert out["replay"] == [], f"rank {rank}: {out['replay']}"  # the pieces hold what to_local() holds
        assert out["fused"] == [f"model.layers.{i}.mlp.experts.{n}" for i in (0, 1)
                                for n in ("down_proj", "gate_up_proj")]
        assert out["placements"] == ["(Shard(dim=0),)"]
    observed = {r: RankLayout.from_json(out["layout"]) for r, out in enumerate(outs)}
    gate_up = {t.name: t for t in observed[1].tensors}[f"{L0}.gate_up_proj"]
    assert gate_up.shape == (2, 64, 64) and sorted(p.canonical for p in gate_up.pieces) == [
        f"{L0}.{e}.{w}_proj.weight" for e in (2, 3) for w in ("gate", "up")]
    unfused, problems = check_text(_spec(config_dir / "config.json", dp, False))
    assert not problems and all(diff_layouts(observed[r], unfused.trainer.ranks[r]) for r in observed)

    draft = draft_spec({"config": str(config_dir / "config.json")}, trainer_preset="fsdp2", trainer_mesh={"dp": dp},
                       rollout_preset="vllm", rollout_mesh={"tp": 1})
    fit = fit_side(draft.text, "trainer", observed)
    assert fit.chosen == {"params.fused_experts": True}
    fitted, problems = check_text(fit.text)
    assert not problems, [str(p) for p in problems]
    for r, live in observed.items():
        assert diff_layouts(live, fitted.trainer.ranks[r]) == [], f"rank {r}"
    assert set(fitted.spec.trainer.pins) == set(observed)
    # the same from the command line: `weightbridge fit`, then `weightbridge diff` of each live rank (exit 0)
    assert fit_and_diff_cli(tmp_path, draft.text, [out["layout"] for out in outs]) == fit.text
