"""Worker-side verification: is the live model exactly what vLLM's own loader makes of a checkpoint?

Runs in a vLLM worker (``llm.collective_rpc("weightbridge_check", args=(checkpoint_dir,))`` with
``worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"``). A second copy of the
model class loads the checkpoint with vLLM's own ``load_weights`` (HF names, as at engine start),
then the comparison is bitwise, in two frames:

1. checkpoint format: the engine's receive buffers (what weightbridge wrote into the model) vs
   the copy's parameters after ``load_weights`` and before post-processing; names and values;
2. kernel format: the live model's parameters vs the copy's after ``process_weights_after_loading``
   (on CPU, e.g. embeddings, norms, prepacked MoE experts; linear weights are empty in both, and
   generation checks what their packed GEMMs hold).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.numel() else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def check_worker(worker: Any, checkpoint_dir: str, limit: int = 10) -> list[str]:
    """Mismatches (empty: bitwise identical in both frames) for this worker's rank."""
    from safetensors import safe_open
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from weightbridge.integrations.vllm.probing import fresh_model

    engine = worker.weight_transfer_engine
    cfg = worker.vllm_config
    copy_model = fresh_model(cfg, engine.device)
    files = sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))
    if not files:
        return [f"no *.safetensors in {checkpoint_dir}"]

    def weights():
        for path in files:
            with safe_open(path, "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, f.get_tensor(key)

    with set_current_vllm_config(cfg), torch.no_grad():
        copy_model.load_weights(weights())
    bad: list[str] = []
    pre = dict(copy_model.named_parameters())
    if set(pre) != set(engine.buffers):
        bad.append(f"checkpoint-format names differ: only vLLM {sorted(set(pre) - set(engine.buffers))[:5]}, "
                   f"only weightbridge {sorted(set(engine.buffers) - set(pre))[:5]}")
    for name in sorted(set(pre) & set(engine.buffers)):
        if not _same(engine.buffers[name], pre[name]):
            bad.append(f"checkpoint format: {name} differs from vLLM's load_weights")
    with set_current_vllm_config(cfg):
        process_weights_after_loading(copy_model, cfg.model_config, engine.device)
    live = dict(engine.model.named_parameters())
    post = dict(copy_model.named_parameters())
    if set(live) != set(post):
        bad.append(f"kernel-format names differ: {sorted(set(live) ^ set(post))[:5]}")
    for name in sorted(set(live) & set(post)):
        if not _same(live[name], post[name]):
            bad.append(f"kernel format: {name} {tuple(live[name].shape)} differs from a fresh load + processing")
    del copy_model
    return bad[:limit]
