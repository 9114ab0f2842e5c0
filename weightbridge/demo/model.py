"""The demo's model and specs: a small Qwen2-style config, written next to the specs that name it.

The config is generated (no hub): hidden 256, 4 layers, 8 query / 4 KV heads, a 4000-token
vocabulary (vLLM pads it to 4032), tied embeddings; about 4.2M parameters. The trainer keeps
float32 master weights, the rollout engines bfloat16 (the cast happens on the sender).
"""

from __future__ import annotations

import json
from pathlib import Path

DEMO_CONFIG: dict = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 4000,
    "max_position_embeddings": 256,
    "max_window_layers": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# The trainer: FSDP2 (fully_shard) over 2 data-parallel ranks, float32 master weights.
# The rollout side: 2 vLLM-style engine instances of tensor-parallel size 2 (fused qkv_proj and
# gate_up_proj, padded vocabulary), bfloat16.
SPEC_TEMPLATE = """\
# weightbridge demo: FSDP2 dp2 (fp32) -> 2 x vLLM TP2 (bf16), {mode} mode.
version: 1
model:
  config: config.json
trainer:
  preset: fsdp2
  mesh: {{dp: 2}}
  dtype: float32
rollout:
  preset: vllm
  instances: 2
  mesh: {{tp: 2}}
sync:
  mode: {mode}
  max_staleness: 1
  round_bytes: 4MiB
  transport: gloo
  timeout_s: {timeout_s}
  heartbeat_s: 0.5
"""


def write_demo_files(directory: Path, modes: tuple[str, ...], timeout_s: float) -> dict[str, Path]:
    """Write ``config.json`` and one spec per mode into ``directory``; return the spec paths."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(DEMO_CONFIG, indent=2))
    paths = {}
    for mode in modes:
        path = directory / f"demo_{mode}.yaml"
        path.write_text(SPEC_TEMPLATE.format(mode=mode, timeout_s=timeout_s))
        paths[mode] = path
    return paths


def build_fsdp2_model(mesh):
    """The demo model, seeded identically on every trainer rank, sharded with FSDP2 over ``mesh``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from weightbridge.demo.fsdp2 import shard_dp

    cfg = {k: v for k, v in DEMO_CONFIG.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(0)
    return shard_dp(Qwen2ForCausalLM(Qwen2Config(**cfg)).float(), mesh)
