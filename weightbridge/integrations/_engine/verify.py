"""Is a worker's model exactly what the engine's own loader makes of a checkpoint? (bitwise, two frames)

The engine-specific part (:mod:`weightbridge.integrations.vllm.verify`,
:mod:`weightbridge.integrations.sglang.verify`) builds a second copy of the model class and loads
the checkpoint with the engine's own ``load_weights`` (:func:`checkpoint_weights`), then lets
:func:`compare` check, bit for bit (shapes and dtypes too):

1. checkpoint format: what weightbridge wrote into the model (the copy of each tensor it wrote that
   test hooks make a worker keep; without them a staging worker's staging copy, which in async mode
   may already hold the next version) vs the copy's parameters after ``load_weights``, before
   post-processing; names and values;
2. the engine's served format: the live model's parameters vs the copy's after the engine's
   post-processing.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Mapping

import torch


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (``-0.0`` differs from ``0.0``; a NaN equals the same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def checkpoint_files(checkpoint_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))


def checkpoint_weights(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every tensor in ``files``, as an engine's ``load_weights`` takes them."""
    from safetensors import safe_open

    for path in files:
        with safe_open(path, "pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield key, f.get_tensor(key)


# The first words of compare()'s note that a streaming worker (in place, no test hooks) kept nothing to
# compare in the checkpoint format; the served format is compared all the same. Benchmarks timing the
# in-place path (no test hooks: they would add a copy per tensor) skip this note, never a mismatch.
NOT_KEPT = "checkpoint format: not compared"


def compare(engine: str, served: str, buffers: Mapping[str, torch.Tensor], loaded: Mapping[str, torch.Tensor],
            post_process: Callable[[], Mapping[str, torch.Tensor]], live: Mapping[str, torch.Tensor],
            limit: int = 10) -> list[str]:
    """Mismatches (empty: bitwise identical in both frames). ``loaded``: the copy's parameters after
    the engine's ``load_weights``; ``post_process()``: runs the engine's post-processing on the copy
    and returns its parameters then; ``served``: the engine's name for that frame."""
    bad: list[str] = []
    if not buffers:
        bad.append(f"{NOT_KEPT}: the worker keeps no copy of what it wrote into {engine} "
                   "(it keeps one with WEIGHTBRIDGE_TEST_HOOKS=1; a staging worker has its staging copy)")
    elif set(loaded) != set(buffers):
        bad.append(f"checkpoint-format names differ: only {engine} {sorted(set(loaded) - set(buffers))[:5]}, "
                   f"only weightbridge {sorted(set(buffers) - set(loaded))[:5]}")
    for name in sorted(set(loaded) & set(buffers)):
        if not same_bits(buffers[name], loaded[name]):
            bad.append(f"checkpoint format: {name} differs from {engine}'s load_weights")
    post = post_process()
    if set(live) != set(post):
        bad.append(f"{served}-format names differ: {sorted(set(live) ^ set(post))[:5]}")
    for name in sorted(set(live) & set(post)):
        if not same_bits(live[name], post[name]):
            bad.append(f"{served} format: {name} {tuple(live[name].shape)} differs from {engine}'s load + "
                       "post-processing")
    return bad[:limit]
