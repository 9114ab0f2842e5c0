"""The fsdp2 preset cross-checked against DTensor itself.

(a) No processes: a ``DeviceMesh`` built with ``_init_backend=False, _rank=r`` lets
    ``compute_local_shape_and_global_offset`` and ``distribute_tensor(...,
    src_data_rank=None)`` run for every rank ``r`` in this process, for Shard,
    Replicate and ``_StridedShard`` placements (the latter constructed directly).
    Each rank's (local shape, global offset) and its actual local elements are
    compared with the preset's IR on shapes with uneven dims.
(b) Real processes: a CPU Gloo world (dp x tp) runs torch's tensor-parallel plan
    and FSDP2 ``fully_shard`` on a tiny HF Llama (bundled tiny-llama config) and
    compares every parameter's ``to_local()`` bitwise with the IR (see
    ``_fsdp2_worker.py``); the placements seen are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from math import prod
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from weightbridge.canonical import bundled_config_path
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor
from weightbridge.layout.templates import skeleton

from ._materialise import CanonicalIds, build, materialise, tiny_model

MESHES = [(2, 1), (3, 2), (4, 2), (2, 4)]  # (dp, tp)

# Shapes with dims uneven over dp (and empty chunks at dp=4); tp-sharded dims divide by tp (1, 2, 4).
UNEVEN = CanonicalModel(
    tensors=tuple(
        sorted(
            [
                CanonicalTensor("model.embed_tokens.weight", (20, 6), "float32"),
                CanonicalTensor("lm_head.weight", (20, 6), "float32"),
                CanonicalTensor("model.layers.0.self_attn.q_proj.weight", (20, 6), "float32"),
                CanonicalTensor("model.layers.0.self_attn.q_proj.bias", (20,), "float32"),
                CanonicalTensor("model.layers.0.self_attn.k_proj.weight", (12, 6), "float32"),
                CanonicalTensor("model.layers.0.self_attn.k_proj.bias", (12,), "float32"),
                CanonicalTensor("model.layers.0.self_attn.v_proj.weight", (12, 6), "float32"),
                CanonicalTensor("model.layers.0.self_attn.o_proj.weight", (6, 20), "float32"),
                CanonicalTensor("model.layers.0.mlp.gate_proj.weight", (28, 6), "float32"),
                CanonicalTensor("model.layers.0.mlp.up_proj.weight", (28, 6), "float32"),
                CanonicalTensor("model.layers.0.mlp.down_proj.weight", (7, 28), "float32"),
                CanonicalTensor("model.layers.0.input_layernorm.weight", (7,), "float32"),
                CanonicalTensor("model.layers.0.mlp.gate.weight", (5, 3, 2), "float32"),
                CanonicalTensor("model.norm.weight", (6,), "float32"),
            ]
        )
    ),
    params=(("num_layers", 1), ("tie_word_embeddings", False)),
)

ROW_TP = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
COL_TP = ("o_proj", "down_proj")


def fsdp2_placements(name: str, tp: int):
    """What FSDP2-on-TP gives a parameter on the (dp, tp) mesh (torch's TP plan + fully_shard)."""
    if any(f".{k}." in f".{name}" for k in ROW_TP):
        return (_StridedShard(0, split_factor=tp), Shard(0))  # Colwise Shard(0), then FSDP dim 0
    if any(f".{k}." in f".{name}" for k in COL_TP):
        return (Shard(0), Shard(1))  # Rowwise Shard(1), then FSDP dim 0
    return (Shard(0), Replicate())  # no TP plan: replicated over tp, FSDP dim 0


def fake_mesh(dp: int, tp: int, rank: int) -> DeviceMesh:
    return DeviceMesh(
        "cpu", torch.arange(dp * tp).reshape(dp, tp), mesh_dim_names=("dp", "tp"), _init_backend=False, _rank=rank
    )


@pytest.mark.parametrize("dp, tp", MESHES)
def test_fsdp2_matches_dtensor_offsets_and_elements(dp: int, tp: int) -> None:
    canon = CanonicalIds.of(UNEVEN)
    _, layout, problems = build("trainer", "fsdp2", {"dp": dp, "tp": tp}, UNEVEN)
    assert problems == []
    assert layout.world_size == dp * tp
    seen = set()
    for rank in layout.ranks:
        mesh = fake_mesh(dp, tp, rank.rank)
        assert tuple(mesh.get_coordinate()) == (dict(rank.coords)["dp"], dict(rank.coords)["tp"])
        for ct in UNEVEN.tensors:
            placements = fsdp2_placements(ct.name, tp)
            seen.add((skeleton(ct.name)[0], str(placements)))
            local = rank.tensor(ct.name)
            shape, offset = compute_local_shape_and_global_offset(ct.shape, mesh, placements)
            assert local.shape == tuple(shape), (
                f"rank {rank.rank} {ct.name} {placements}: {local.shape} vs DTensor {shape}"
            )
            if prod(shape) == 0:
                assert local.pieces == ()
            else:
                (piece,) = local.pieces
                assert piece.local_box == tuple((0, n) for n in shape)
                want = tuple((o, o + n) for o, n in zip(offset, shape))
                assert piece.canonical_box == want, f"rank {rank.rank} {ct.name} {placements}"
            # the actual elements DTensor puts on this rank, from a tensor of distinct ids
            ids = torch.from_numpy(canon.arrays[ct.name].copy())
            dt = distribute_tensor(ids, mesh, placements, src_data_rank=None)
            assert tuple(dt.placements) == tuple(placements)
            np.testing.assert_array_equal(
                dt.to_local().numpy(), materialise(local, canon), err_msg=f"rank {rank.rank} {ct.name}"
            )
    assert len(seen) >= 3


@pytest.mark.parametrize("dp, tp", MESHES)
def test_strided_shard_is_tp_then_fsdp_chunking(dp: int, tp: int) -> None:
    """_StridedShard(0, split_factor=tp) on dp + Shard(0) on tp == torch.chunk over tp, then over dp
    (what FSDP2 does to the TP-local tensor), for every row count tp divides."""
    for rows in range(tp, 6 * tp * dp + 1, tp):
        g = torch.arange(rows)
        for r in range(dp * tp):
            mesh = fake_mesh(dp, tp, r)
            d, t = r // tp, r % tp
            tp_local = torch.chunk(g, tp)[t]
            chunks = list(torch.chunk(tp_local, dp))
            want = chunks[d] if d < len(chunks) else g[:0]
            got = distribute_tensor(
                g, mesh, (_StridedShard(0, split_factor=tp), Shard(0)), src_data_rank=None
            ).to_local()
            assert torch.equal(got, want), (rows, dp, tp, r)


def test_fsdp2_preset_rejects_rows_tp_does_not_divide() -> None:
    """torch would chunk such rows unevenly over tp, where DTensor's _StridedShard no longer
    matches FSDP2's storage; the preset refuses the mesh instead."""
    model = CanonicalModel(
        (CanonicalTensor("model.layers.0.self_attn.q_proj.weight", (10, 4), "float32"),), (("num_layers", 1),)
    )
    _, _, problems = build("trainer", "fsdp2", {"dp": 2, "tp": 4}, model)
    assert problems and any(p.axis == "tp" for p in problems)


# ---------------------------------------------------------------------------------------------
# (b) Real FSDP2 + TP on Gloo
# ---------------------------------------------------------------------------------------------

WORLDS = [(2, 2), (3, 2)]  # dp x tp: the even 4-rank world, and an uneven one (dp = 3)


def _kind(name: str) -> str:
    return skeleton(name)[0].replace("#", "*")


@pytest.mark.multiprocess
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with Gloo")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the launcher forks its ranks")
def test_fsdp2_tp_real_world_matches_ir(tmp_path: Path) -> None:
    model = tiny_model("tiny-llama")
    worlds = []
    for dp, tp in WORLDS:
        _, layout, problems = build("trainer", "fsdp2", {"dp": dp, "tp": tp}, model)
        assert problems == []
        name = f"layouts_{dp}x{tp}.json"
        (tmp_path / name).write_text(json.dumps([r.to_json() for r in layout.ranks]))
        worlds.append({"dp": dp, "tp": tp, "layouts": name})
    job = {"config": str(bundled_config_path("tiny-llama")), "seed": 0, "timeout_s": 60, "worlds": worlds}
    (tmp_path / "job.json").write_text(json.dumps(job))
    worker = Path(__file__).with_name("_fsdp2_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(worker), str(tmp_path)], check=False, capture_output=True, text=True, timeout=150, env=env
    )

    placements: dict[str, set] = defaultdict(set)
    failures = []
    for dp, tp in WORLDS:
        for rank in range(dp * tp):
            path = tmp_path / f"result_{dp}x{tp}_{rank}.json"
            assert path.exists(), f"world {dp}x{tp} rank {rank} wrote no result\n{proc.stderr[-3000:]}"
            res = json.loads(path.read_text())
            assert "error" not in res, f"world {dp}x{tp} rank {rank} failed:\n{res['error']}"
            assert res["mesh_coord"] == [res["coords"]["dp"], res["coords"]["tp"]]
            assert res["missing_in_model"] == []
            for name, rec in res["params"].items():
                placements[f"{_kind(name)} (dp={dp}, tp={tp})"].add(
                    f"{rec['placements_repr']} on {tuple(rec['mesh_dims'])}"
                )
                if rec.get("error") or not rec["bitwise_equal"] or not rec["all_covered"]:
                    failures.append((dp, tp, rank, name, rec))
    assert proc.returncode == 0, proc.stderr[-3000:]
    print("\nFSDP2 + TP placements seen (CPU Gloo):")
    for kind in sorted(placements):
        print(f"  {kind}: {', '.join(sorted(placements[kind]))}")
    assert not failures, failures[:5]
