"""The trainer side for the vLLM integration's conformance run: an FSDP2 (dp 2, float32) HF model.

The model is the checkpoint the spec's ``model.config`` points at (the bundled
``tiny-qwen2-vllm``, written by ``conftest.py``), built as ``weightbridge.testing._internal.vllm_selfcheck``'s
``trainer_main`` builds it (transformers' model, ``fully_shard`` per layer and on the whole model);
the rollout side is :mod:`weightbridge.integrations.vllm.conformance` (a real ``vllm.LLM``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from weightbridge.demo.fsdp2 import shard_dp
from weightbridge.testing._internal.fsdp2 import FSDP2TrainerRank


class QwenFSDP2TrainerRank(FSDP2TrainerRank):
    """One FSDP2 trainer rank (transformers' model, DTensor shards on dp)."""

    def build_model(self, ctx, mesh):
        import yaml
        from transformers import AutoConfig, AutoModelForCausalLM

        model_dir = Path(yaml.safe_load(Path(ctx.spec_path).read_text())["model"]["config"]).parent
        torch.manual_seed(0)
        return shard_dp(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32),
                        mesh)
