"""Process bodies and specs for the FP8-at-the-sender bridge tests (run through ``localrun.launch``).

A tiny Qwen3 config whose quantised dims are multiples of 128 (hidden 256, 2 heads of 128, 2 KV
heads, intermediate 256) in bf16; trainer ranks hold float32 master weights. The expected rollout
values are the checkpoint a fresh engine would load: every tensor cast to bf16, the quantised
weights as :func:`weightbridge.quant.iter_quantized` makes them (vLLM's arithmetic).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.quant import iter_quantized
from weightbridge.tensors import materialize, torch_dtype
from weightbridge.tensors import layout_mismatches as mismatches
from weightbridge.transport.store import open_store

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
          "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
          "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 256, "tie_word_embeddings": False,
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}


def write_config(directory: Path, **overrides) -> Path:
    path = Path(directory) / "config.json"
    path.write_text(json.dumps({**CONFIG, **overrides}))
    return path


def spec_text(config: Path, *, dp: int = 2, tp: int = 2, quantization: str = "{block: [128, 128]}",
              round_bytes: str = "64KiB", instances: int = 1, timeout_s: float = 20.0, delta: str = "off") -> str:
    return (f"version: 1\nmodel: {{config: {config}}}\n"
            f"trainer: {{preset: fsdp2, mesh: {{dp: {dp}}}, dtype: float32}}\n"
            f"rollout: {{preset: vllm, instances: {instances}, mesh: {{tp: {tp}}}, quantization: {quantization}}}\n"
            f"sync: {{mode: sync, round_bytes: {round_bytes}, timeout_s: {timeout_s}, heartbeat_s: 0.2, "
            f"delta: {delta}}}\n")


def master(resolved, version: int) -> dict[str, torch.Tensor]:
    """The trainer's float32 weights of ``version`` (canonical names; scale tensors are derived): a
    fresh draw at version 0, then 1% of the elements redrawn per version (deltas have little to send)."""
    g = torch.Generator().manual_seed(7000)
    scales = {q.scale for q in resolved.canonical.quant}
    out = {t.name: torch.randn(t.shape, generator=g) * 0.05 for t in resolved.canonical.tensors if t.name not in scales}
    for v in range(1, max(version, 0) + 1):
        g = torch.Generator().manual_seed(7000 + v)
        for t in out.values():
            pick = torch.rand(t.shape, generator=g) < 0.01
            t[pick] = torch.randn(int(pick.sum()), generator=g) * 0.05
    return out


def served(resolved, version: int) -> dict[str, torch.Tensor]:
    """What a fresh engine holds after loading the bf16 checkpoint of ``version``, canonically."""
    bf16 = {k: v.to(torch_dtype(resolved.canonical[k].dtype)) for k, v in master(resolved, version).items()}
    return dict(iter_quantized(bf16, resolved.rollout.quant))


def main(role: str, spec: str, rank: int, port: int, versions: list[int]) -> list[tuple]:
    r = load_spec(spec)
    store = open_store("127.0.0.1", port, is_master=False, timeout_s=r.sync.timeout_s)
    events: list[tuple] = []
    if role == "trainer":
        layout = r.trainer.ranks[rank]
        tensors = materialize(layout, master(r, 0))
        bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, store=store)
        for v in versions:
            fresh = materialize(layout, master(r, v))
            with torch.no_grad():
                for name, t in tensors.items():
                    t.copy_(fresh[name])
            s = bridge.push(v)
            events.append(("pushed", v, s.bytes_sent, s.delta_buckets))
        bridge.close()
        return events
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, served(r, -1))
    bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, store=store, staging=False,
                                     options=BridgeOptions())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (bridge.version or 0) < versions[-1]:
        if bridge.poll():
            v = bridge.apply()
            events.append(("applied", v, mismatches(layout, tensors, served(r, v)),
                           {t.name: t.dtype for t in layout.tensors}))
        time.sleep(0.002)
    bridge.close()
    return events
