"""Megatron-Core as the trainer (extra ``megatron``: ``pip install --no-deps megatron-core==0.16.1``
plus ``numpy packaging einops``; see ``integration_guides/megatron.md``).

* :func:`layout_from_megatron` — this rank's trainer layout IR (canonical HF coordinates) read
  from a built ``GPTModel`` and ``megatron.core.parallel_state``; reads module attributes and
  parameter shapes only, never moves data (the Megatron analogue of
  :func:`weightbridge.probe.layout_from_dtensors`). Called on every trainer rank.
* :func:`megatron_tensors` — the rank's live tensors by the same local names (what
  ``TrainerBridge.from_spec(..., tensors=...)`` and ``push`` take).
* :func:`mesh_from_parallel_state` — the spec's ``trainer.mesh`` (tp/pp/dp/cp/ep/etp) of the
  running world, for writing or checking a spec.
* :func:`param_sync_hook` / :func:`gather_params` / :func:`pending_param_gathers` — with the
  distributed optimizer and ``overlap_param_gather`` the replicas hold stale parameters until the
  next forward: ``BridgeOptions(before_push=param_sync_hook(model))`` gathers them before every
  push (or refuses it with ``StaleParameters``).
* :mod:`~weightbridge.integrations.megatron.cpu_trainer` — a Megatron-Core trainer rank on CPU
  (``MegatronTrainerRank``: a conformance-suite ``wb_trainer`` factory).

Everything imports lazily: importing this package needs neither Megatron nor torch.distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from weightbridge.integrations.megatron.introspect import (  # noqa: F401
        UnsupportedParameter,
        layout_from_megatron,
        megatron_tensors,
        mesh_from_parallel_state,
    )
    from weightbridge.integrations.megatron.params import (  # noqa: F401
        gather_params,
        param_sync_hook,
        pending_param_gathers,
    )

INSTALL_HINT = ("pip install --no-deps megatron-core==0.16.1 numpy packaging einops "
                "(the extra 'weightbridge-rl[megatron]'; --no-deps keeps your torch)")
_LAZY = {"layout_from_megatron", "megatron_tensors", "mesh_from_parallel_state", "UnsupportedParameter"}
_PARAMS = {"gather_params", "param_sync_hook", "pending_param_gathers"}
__all__ = sorted(_LAZY | _PARAMS | {"INSTALL_HINT"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from weightbridge.integrations.megatron import introspect

        return getattr(introspect, name)
    if name in _PARAMS:
        from weightbridge.integrations.megatron import params

        return getattr(params, name)
    raise AttributeError(name)
