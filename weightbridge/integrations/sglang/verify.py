"""Worker-side verification: is the live model exactly what SGLang's own loader makes of a checkpoint?

Runs in an SGLang worker (the ``check`` command; ``SGLangWeightSync.check(checkpoint_dir)``). A
second copy of the model class loads the checkpoint with SGLang's own loading path (its
``load_weights`` fed from the safetensors files, then ``DefaultModelLoader.postprocess_weights``,
as at engine start and in ``update_weights_from_disk``); the comparison
(:func:`weightbridge.integrations._engine.verify.compare`) is bitwise, in two frames:

1. checkpoint format: what weightbridge wrote into the model (``buffers``: what the worker recorded
   with test hooks, else its staging copy) vs the copy's parameters after
   ``load_weights``, before post-processing; names and values;
2. served format: every live parameter of the engine vs the copy's after post-processing.
"""

from __future__ import annotations

from typing import Any

import torch

from weightbridge.integrations._engine.verify import checkpoint_files, checkpoint_weights, compare


def check_worker(receiver: Any, checkpoint_dir: str, limit: int = 10) -> list[str]:
    """Mismatches (empty: bitwise identical in both frames) for this worker's rank."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    from weightbridge.integrations.sglang.probing import fresh_model

    files = checkpoint_files(checkpoint_dir)
    if not files:
        return [f"no *.safetensors in {checkpoint_dir}"]
    copy = fresh_model(receiver.model)
    with torch.no_grad():
        copy.load_weights(checkpoint_weights(files))

    def post_process() -> dict[str, torch.Tensor]:
        DefaultModelLoader.postprocess_weights(copy, receiver.device)
        return dict(copy.named_parameters())

    return compare("SGLang", "served", receiver.buffers, dict(copy.named_parameters()), post_process,
                   dict(receiver.model.named_parameters()), limit)
