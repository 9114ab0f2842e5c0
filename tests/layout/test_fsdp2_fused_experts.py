"""The fsdp2 preset on transformers 5 MoE models: fused in-memory experts, Mixtral's renames and the
persistent buffers that are checkpoint tensors, against what FSDP2 really holds.

For tiny Qwen3-MoE, Mixtral, DeepSeek-V3 and GLM-4-MoE models (the architecture zoo's configs,
random float32 weights): the checkpoint is what ``save_pretrained`` writes (one tensor per expert,
Mixtral's ``block_sparse_moe.*`` names); a trainer rank's tensors are
:func:`weightbridge.trainer_tensors` of the model under ``fully_shard`` on dp, i.e. every parameter
``distribute_tensor(..., [Shard(0)])`` (uneven ``torch.chunk`` at dp 3) and every persistent buffer
whole, cut here for each rank with a DeviceMesh that needs no process group. The preset's IR of each
rank, materialised from the checkpoint, must hold exactly those tensors: same names, bitwise.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from weightbridge import trainer_tensors
from weightbridge.canonical import load_canonical
from weightbridge.tensors import bitwise_equal, materialize, needed_names

from ._materialise import build
from .test_fsdp2_dtensor import fake_mesh

pytest.importorskip("transformers")

ARCHS = ["qwen3-moe", "mixtral", "deepseek-v3", "glm4-moe"]


def _model_and_checkpoint(name: str, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from weightbridge.testing._internal.zoo_models import ARCHS as ZOO, hf_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(ZOO[name]), dtype=torch.float32)
    with torch.no_grad():  # buffers too (e_score_correction_bias starts at zero)
        for _, b in model.named_buffers():
            if b.is_floating_point():
                b.copy_(torch.randn_like(b))
    model.save_pretrained(tmp_path)
    return model, load_file(str(tmp_path / "model.safetensors")), load_canonical({"config": str(tmp_path)}, ".")


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("dp", [2, 3])
def test_fsdp2_preset_equals_fully_shard_of_transformers_moe(name: str, dp: int, tmp_path) -> None:
    model, checkpoint, canonical = _model_and_checkpoint(name, tmp_path)
    full = trainer_tensors(model)
    params = dict(model.named_parameters())
    assert any(".experts.gate_up_proj" in n for n in full)  # fused in memory
    assert not any(".experts.0." in n for n in full) and any(".experts.0." in n for n in checkpoint)
    _, layout, problems = build("trainer", "fsdp2", {"dp": dp}, canonical, dtype="float32")
    assert problems == [], [p.message for p in problems]
    for rank in layout.ranks:
        mesh = fake_mesh(dp, 1, rank.rank)
        want = {n: (distribute_tensor(t.detach(), mesh, [Shard(0), Replicate()], src_data_rank=None).to_local()
                    if n in params else t) for n, t in full.items()}
        want = {n: t for n, t in want.items() if t.numel()}  # torch.chunk: a trailing rank may hold nothing
        got = materialize(rank, {n: checkpoint[n] for n in needed_names(rank)})
        got = {n: t for n, t in got.items() if t.numel()}
        assert sorted(got) == sorted(want), (rank.rank, sorted(set(got) ^ set(want)))
        for n in want:
            assert bitwise_equal(got[n], want[n].contiguous()), (rank.rank, n)


def test_trainer_tensors_are_the_checkpoint_tensors_in_memory(tmp_path) -> None:
    """Parameters (a tied one once) and persistent buffers; never non-persistent ones (rotary inv_freq)."""
    model, checkpoint, _ = _model_and_checkpoint("deepseek-v3", tmp_path)
    names = set(trainer_tensors(model))
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert not any("inv_freq" in n for n in names)
    assert names == set(model.state_dict())  # exactly what transformers saves (before its renames)
    tied = torch.nn.Linear(4, 4)
    holder = torch.nn.ModuleDict({"a": tied, "b": tied})
    holder.register_buffer("step", torch.zeros(()), persistent=False)
    assert set(trainer_tensors(holder)) == {"a.weight", "a.bias"}
