"""Worker-side verification: is the live model exactly what SGLang's own loader makes of a checkpoint?

Runs in an SGLang worker (the ``check`` command; ``SGLangWeightSync.check(checkpoint_dir)``). A
second copy of the model class loads the checkpoint with SGLang's own loading path (its
``load_weights`` fed from the safetensors files, then ``DefaultModelLoader.postprocess_weights``,
as at engine start and in ``update_weights_from_disk``); the comparison is bitwise, in two frames:

1. checkpoint format: the worker's receive buffers (what weightbridge wrote into the model) vs the
   copy's parameters after ``load_weights``, before post-processing; names and values;
2. served format: every live parameter of the engine vs the copy's after post-processing.
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


def check_worker(receiver: Any, checkpoint_dir: str, limit: int = 10) -> list[str]:
    """Mismatches (empty: bitwise identical in both frames) for this worker's rank."""
    from safetensors import safe_open
    from sglang.srt.model_loader.loader import DefaultModelLoader

    from weightbridge.integrations.sglang.probing import fresh_model

    files = sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))
    if not files:
        return [f"no *.safetensors in {checkpoint_dir}"]

    def weights():
        for path in files:
            with safe_open(path, "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, f.get_tensor(key)

    copy = fresh_model(receiver.model)
    with torch.no_grad():
        copy.load_weights(weights())
    bad: list[str] = []
    pre = dict(copy.named_parameters())
    buffers = receiver.buffers
    if set(pre) != set(buffers):
        bad.append(f"checkpoint-format names differ: only SGLang {sorted(set(pre) - set(buffers))[:5]}, "
                   f"only weightbridge {sorted(set(buffers) - set(pre))[:5]}")
    for name in sorted(set(pre) & set(buffers)):
        if not _same(buffers[name], pre[name]):
            bad.append(f"checkpoint format: {name} differs from SGLang's load_weights")
    DefaultModelLoader.postprocess_weights(copy, receiver.device)
    live = dict(receiver.model.named_parameters())
    post = dict(copy.named_parameters())
    if set(live) != set(post):
        bad.append(f"served-format names differ: {sorted(set(live) ^ set(post))[:5]}")
    for name in sorted(set(live) & set(post)):
        if not _same(live[name], post[name]):
            bad.append(f"served format: {name} {tuple(live[name].shape)} differs from SGLang's load + post-processing")
    del copy
    return bad[:limit]
