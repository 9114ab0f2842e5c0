"""DTensor introspection: the trainer IR straight from placements."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from weightbridge.localrun import launch
from weightbridge.probe.diff import diff_layouts, format_diff
from weightbridge.probe.dtensor import layout_from_dtensors
from weightbridge.tensors import canonical_tensors, diff_tensors, materialize

from ._zoo import expand, qwen_like

ROW_TP = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
COL_TP = ("o_proj", "down_proj")


def fsdp2_placements(name: str, tp: int):
    """What torch's TP plan + fully_shard give a parameter on the (dp, tp) mesh."""
    if any(f".{k}." in f".{name}" for k in ROW_TP):
        return (_StridedShard(0, split_factor=tp), Shard(0))
    if any(f".{k}." in f".{name}" for k in COL_TP):
        return (Shard(0), Shard(1))
    return (Shard(0), Replicate())


def fake_mesh(shape, names, rank: int) -> DeviceMesh:
    ranks = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    return DeviceMesh("cpu", ranks, mesh_dim_names=names, _init_backend=False, _rank=rank)


@pytest.mark.parametrize("dp, tp", [(2, 2), (3, 2), (4, 1)])
def test_fake_mesh_fsdp2_tp_matches_preset(dp: int, tp: int) -> None:
    """Every rank of a (dp, tp) mesh in this process: placements -> IR == fsdp2 preset, and the
    IR replayed from the full weights equals ``to_local()``."""
    m = qwen_like(dtype="float32", vocab=36, hidden=10, inter=20)
    full = canonical_tensors(m)
    want = expand("fsdp2", {"dp": dp, "tp": tp}, m, side="trainer")
    for rank in range(dp * tp):
        mesh = fake_mesh((dp, tp), ("dp", "tp"), rank)
        params = {n: distribute_tensor(full[n], mesh, fsdp2_placements(n, tp), src_data_rank=None) for n in full}
        lay = layout_from_dtensors(params, rank=rank)
        d = diff_layouts(lay, want.ranks[rank], strict=True)
        assert not d, f"rank {rank}\n{format_diff(d)}"
        assert dict(lay.coords) == {"dp": rank // tp, "tp": rank % tp}
        assert diff_tensors(materialize(lay, full), {n: p.to_local() for n, p in params.items()}) == []


def test_strided_shard_non_contiguous_rows_give_several_pieces() -> None:
    """_StridedShard alone on a 1-D mesh: a rank's rows are strided chunks, not one range."""
    x = torch.arange(24.0).reshape(12, 2)
    for rank in range(2):
        mesh = fake_mesh((2,), ("dp",), rank)
        dt = distribute_tensor(x, mesh, (_StridedShard(0, split_factor=3),), src_data_rank=None)
        lay = layout_from_dtensors({"w": dt}, rank=rank)
        (t,) = lay.tensors
        assert len(t.pieces) > 1
        assert diff_tensors(materialize(lay, {"w": x}), {"w": dt.to_local()}) == []


def test_plain_tensors_and_name_map() -> None:
    lay = layout_from_dtensors(
        {"a.w": torch.zeros(3, 4), "skip": torch.zeros(2), "s": torch.tensor(1.0)},
        name_map=lambda n: None if n == "skip" else f"model.{n}",
    )
    assert [t.name for t in lay.tensors] == ["a.w", "s"]
    assert lay.tensor("a.w").pieces[0].canonical == "model.a.w"
    assert lay.tensor("s").pieces[0].local_box == ()


@pytest.mark.multiprocess
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with Gloo")
def test_real_fsdp2_tp_world_matches_preset(tmp_path: Path) -> None:
    from ._dtensor_world import run_rank

    dp, tp = 2, 2
    store = str(tmp_path / "store")
    results = launch(run_rank, [(r, store, dp, tp) for r in range(dp * tp)], timeout_s=90, preload=["tests.probe._zoo"])
    outs = [r.unwrap() for r in results]
    placements = set()
    for rank, out in enumerate(outs):
        assert out["diff"] == "", f"rank {rank}:\n{out['diff']}"
        assert out["replay"] == [], f"rank {rank}: {out['replay']}"
        assert out["coords"] == {"dp": rank // tp, "tp": rank % tp}
        placements.update(out["placements"])
    assert any("_StridedShard" in p for p in placements), placements
