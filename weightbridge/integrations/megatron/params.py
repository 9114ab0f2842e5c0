"""Megatron's deferred parameter all-gather and ``push``: every replica must hold the new parameters.

With the distributed optimizer, each data-parallel rank updates only its shard of the parameters;
an all-gather then gives every replica the whole. With ``overlap_param_gather`` Megatron-Core
(0.16) defers that all-gather to the next forward (a forward pre-hook per module waits for its
bucket), so between ``optimizer.step()`` and the next forward the replicas hold stale copies of
everything but their own shard, and the planner lets any replica send any box. Read from
Megatron's own state (``DistributedDataParallel.use_forward_hook``, each bucket group's
``param_gather_dispatched`` and ``param_gather_handle``):

* :func:`pending_param_gathers`: the bucket groups whose all-gather has not completed;
* :func:`gather_params`: complete them now (``DistributedDataParallel.start_param_sync(force_sync=True)``:
  a collective over the data-parallel group, so every trainer rank calls it, as ``push``);
* :func:`param_sync_hook`: the ``BridgeOptions(before_push=...)`` hook that gathers (or refuses with
  :class:`~weightbridge.errors.StaleParameters`) at the start of every ``push``.

After a gather the next forward finds every bucket gathered and waits for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from weightbridge.errors import StaleParameters


def _ddp_modules(model: Any) -> list[Any]:
    """The DDP wrappers of ``model`` (a model, a DDP, or a list of model chunks) that defer the gather."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    out = []
    for chunk in chunks:
        m = chunk
        while m is not None:
            if getattr(m, "use_forward_hook", False) and hasattr(m, "bucket_groups"):
                out.append(m)
                break
            m = getattr(m, "module", None)
    return out


def _groups(ddp: Any) -> list[Any]:
    return list(getattr(ddp, "bucket_groups", ())) + list(getattr(ddp, "expert_parallel_bucket_groups", ()))


def pending_param_gathers(model: Any) -> int:
    """How many bucket groups of ``model`` have a parameter all-gather not yet completed (0: every
    replica holds the parameters the optimizer produced, or the gather is not deferred)."""
    return sum(1 for ddp in _ddp_modules(model) for g in _groups(ddp)
               if not g.param_gather_dispatched or g.param_gather_handle is not None)


def gather_params(model: Any) -> int:
    """Complete every pending parameter all-gather of ``model`` now; returns how many bucket groups were
    pending. A collective over the data-parallel group: every trainer rank calls it (``push`` does, with
    :func:`param_sync_hook`)."""
    pending = pending_param_gathers(model)
    if pending:
        for ddp in _ddp_modules(model):
            ddp.start_param_sync(force_sync=True)
    return pending


def param_sync_hook(model: Any, *, gather: bool = True, rank: Any = "trainer") -> Callable[[], None]:
    """``BridgeOptions(before_push=param_sync_hook(model))``: before every push, gather the parameters
    if Megatron deferred it (``gather=True``), else raise :class:`~weightbridge.errors.StaleParameters`
    naming ``rank`` (nothing is sent)."""

    def before_push() -> None:
        if gather:
            gather_params(model)
        elif pending_param_gathers(model):
            raise StaleParameters(rank, f"{pending_param_gathers(model)} parameter bucket group(s) are not all-gathered "
                                  "yet (distributed optimizer with overlap_param_gather: the replicas hold stale "
                                  "copies until the next forward); call gather_params(model) before push, or "
                                  "pass param_sync_hook(model) (gather=True)")

    return before_push
