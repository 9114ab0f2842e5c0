"""The demo's FSDP2 trainer world, also the one FSDP2 trainer rank of weightbridge's own test runs.

* :func:`shard_dp` — ``fully_shard`` a transformers causal LM per decoder layer and as a whole;
* :class:`FSDP2World` — one trainer rank's state: its own Gloo world (never the bridge's), a dp
  mesh, the model's DTensor parameters (named as in the HF checkpoint), local shards, the full
  tensors (a collective, for verification only) and one optimizer step;
* :class:`FSDP2TrainerRank` — :class:`FSDP2World` as a conformance-suite ``wb_trainer`` factory
  (a suite subclasses it and overrides ``build_model``; the shipped engine suites,
  ``weightbridge examples engine_suites``, do).

Runs inside rank processes (imports torch.distributed lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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


class FSDP2TrainerRank:
    """A :class:`~weightbridge.testing.TrainerRank`: its own Gloo world, a dp mesh, FSDP2 shards.

    Called in the suite's trainer rank processes with the suite's ``RankContext``."""

    def __init__(self, ctx: Any) -> None:
        from weightbridge.bridge import TrainerBridge

        ctx.init_process_group("gloo")
        self.world = FSDP2World(lambda mesh: self.build_model(ctx, mesh), rank=ctx.rank, world_size=ctx.world_size)
        self.params = self.world.params
        self.bridge = TrainerBridge.from_spec(ctx.spec_path, rank=ctx.rank, tensors=self.tensors(),
                                              **ctx.bridge_kwargs())

    def build_model(self, ctx: Any, mesh: Any) -> torch.nn.Module:
        """The model, already ``fully_shard``-ed over ``mesh`` (override)."""
        raise NotImplementedError

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self.world.tensors()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full HF tensors -> this rank's FSDP2 shards (DTensor's own chunking, no communication)."""
        from torch.distributed.tensor import distribute_tensor

        for name, full in weights:
            p = self.params[name]
            shard = distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(shard.to_local())

    def push(self, version: int) -> Any:
        return self.bridge.push(version, tensors=self.tensors())

    def close(self) -> None:
        self.bridge.close()
        self.world.close()


class SpecModelTrainerRank(FSDP2TrainerRank):
    """The spec's own model as an FSDP2 suite trainer rank: transformers' ``from_config`` of the spec's
    ``model.config`` (a ``config.json`` or its directory) or ``model.bundled``, seed 0, float32,
    ``fully_shard`` per decoder layer (:func:`shard_dp`). No checkpoint: the suite pushes what this
    rank holds and compares the engine's copy with it. ``wb_trainer``:
    ``"weightbridge.demo.fsdp2:SpecModelTrainerRank"``."""

    def build_model(self, ctx: Any, mesh: Any) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        config = spec_transformers_config(ctx)
        torch.manual_seed(0)
        return shard_dp(AutoModelForCausalLM.from_config(config, dtype=torch.float32), mesh)



def spec_transformers_config(ctx: Any) -> Any:
    """The transformers config of the suite run's model (``model.config`` or ``model.bundled``);
    ``ctx``: the suite's ``RankContext``."""
    from pathlib import Path

    from weightbridge.canonical.bundled import transformers_config

    return transformers_config(ctx.resolved().spec.model, Path(ctx.spec_path).parent)
