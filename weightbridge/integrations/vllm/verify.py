"""Worker-side verification: is the live model exactly what vLLM's own loader makes of a checkpoint?

Runs in a vLLM worker (``llm.collective_rpc("weightbridge_check", args=(checkpoint_dir,))`` with
``worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"``). A second copy of the
model class loads the checkpoint with vLLM's own ``load_weights`` (HF names, as at engine start);
the comparison (:func:`weightbridge.integrations._engine.verify.compare`) is bitwise, in two frames:

1. checkpoint format: what weightbridge wrote into the model (``buffers``: what the worker recorded
   with test hooks, else its staging copy) vs the copy's parameters after
   ``load_weights`` and before post-processing; names and values;
2. kernel format: the live model's parameters vs the copy's after ``process_weights_after_loading``
   (on CPU, e.g. embeddings, norms, prepacked MoE experts; linear weights are empty in both, and
   generation checks what their packed GEMMs hold; FP8 layers hold their prepacked FP8 weights and
   scales in both).

An engine that quantises online has quantised the copy's layers during ``load_weights`` already:
frame 1 then leaves out its FP8 weights and their scales (the receive buffers hold what the sender
quantised, or bf16 for the engine to quantise), and frame 2 compares them.
"""

from __future__ import annotations

from typing import Any

import torch

from weightbridge.integrations._engine.verify import checkpoint_files, checkpoint_weights, compare, same_bits


def check_worker(worker: Any, checkpoint_dir: str, limit: int = 10) -> list[str]:
    """Mismatches (empty: bitwise identical in both frames) for this worker's rank."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from weightbridge.integrations.vllm.probing import fresh_model

    from weightbridge.integrations.vllm.fp8 import engine_format
    from weightbridge.integrations.vllm.probing import online_quantized

    engine = worker.weight_transfer_engine
    cfg = worker.vllm_config
    files = checkpoint_files(checkpoint_dir)
    if not files:
        return [f"no *.safetensors in {checkpoint_dir}"]
    copy_model = fresh_model(cfg, engine.device)
    # parameters no checkpoint tensor fills (an FP8 engine's attention q/k/v/prob scales) are not
    # checkpoint format: left out of frame 1 when loading leaves them as they were
    before = {k: v.detach().clone() for k, v in copy_model.named_parameters()
              if k not in engine.buffers and not v.is_meta}
    with set_current_vllm_config(cfg), torch.no_grad():
        copy_model.load_weights(checkpoint_weights(files))
    buffers, loaded = engine.buffers, dict(copy_model.named_parameters())
    loaded = {k: v for k, v in loaded.items() if k not in before or not same_bits(before[k], v)}
    if online_quantized(cfg):  # frame 1 without the FP8 layers (module docstring)
        fmt = engine_format(engine.model)
        skip = set(fmt) | {f["scale"] for f in fmt.values()}
        buffers = {k: v for k, v in buffers.items() if k not in skip}
        loaded = {k: v for k, v in loaded.items() if k not in skip}

    def post_process() -> dict[str, torch.Tensor]:
        with set_current_vllm_config(cfg):
            process_weights_after_loading(copy_model, cfg.model_config, engine.device)
        return dict(copy_model.named_parameters())

    return compare("vLLM", "kernel", buffers, loaded, post_process, dict(engine.model.named_parameters()), limit)
