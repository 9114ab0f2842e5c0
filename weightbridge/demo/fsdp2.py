"""The demo's FSDP2 trainer world, also the one FSDP2 trainer rank of weightbridge's own test runs.

* :func:`shard_dp` — ``fully_shard`` a transformers causal LM per decoder layer and as a whole;
* :class:`FSDP2World` — one trainer rank's state: its own Gloo world (never the bridge's), a dp
  mesh, the model's DTensor parameters (named as in the HF checkpoint), local shards, the full
  tensors (a collective, for verification only) and one optimizer step.

Runs inside rank processes (imports torch.distributed lazily). The conformance-suite trainer rank
built on it is a test harness (``weightbridge.testing._internal.fsdp2``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def shard_dp(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """``fully_shard`` every decoder layer of ``model`` (``model.model.layers``), then ``model``."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class FSDP2World:
    """One FSDP2 trainer rank: a dp mesh over ``world_size`` ranks and the model ``build_model(mesh)``.

    With ``store`` the rank first starts its own Gloo default group on ``PrefixStore(prefix, store)``
    (the training framework's world; the bridge never touches it); without, the caller did.
    """

    def __init__(self, build_model: Callable[[Any], torch.nn.Module], *, rank: int, world_size: int,
                 store: Any = None, prefix: str = "trainer-world/") -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if store is not None:
            dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size)
        self.rank = rank
        self.mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        self.model = build_model(self.mesh)
        self.params = dict(self.model.named_parameters())  # a tied lm_head is de-duplicated

    def tensors(self) -> dict[str, torch.Tensor]:
        """This rank's shards by checkpoint name (what the bridge reads)."""
        return {name: p.to_local() for name, p in self.params.items()}

    def full_tensors(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """The full tensors (``DTensor.full_tensor()``: a collective over the world; verification only)."""
        return {name: self.params[name].full_tensor().detach() for name in (names or self.params)}

    def step(self, opt: Any, ids: torch.Tensor) -> float:
        """One optimizer step of the causal-LM loss on ``ids``; the loss."""
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.detach())

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()
