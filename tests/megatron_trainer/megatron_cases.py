"""Rank functions of the Megatron trainer tests (launched by name in fresh processes).

:func:`introspect_rank` runs on every rank of a tiny Megatron-Core world (its own Gloo group on
the test's store): it builds the model, introspects its layout IR (local = Megatron names,
canonical = HF names) and diffs it against the ``megatron`` preset's expansion of the same rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CASES = {  # name: (model kind, HF overrides, trainer mesh)
    "dense-tp2": ("qwen2", {"num_key_value_heads": 2}, {"tp": 2}),
    "dense-pp2": ("qwen2", {"num_key_value_heads": 2}, {"pp": 2}),
    "dense-tp2pp2": ("qwen2", {"num_key_value_heads": 2}, {"tp": 2, "pp": 2}),
    "moe-ep2": ("qwen3-moe", {}, {"ep": 2, "dp": 2}),
    "moe-tp2": ("qwen3-moe", {}, {"tp": 2}),
    "moe-pp2": ("qwen3-moe", {}, {"pp": 2}),
    "moe-tp2ep2": ("qwen3-moe", {}, {"tp": 2, "ep": 2, "dp": 2}),
    "moe-tp2ep2etp1": ("qwen3-moe", {}, {"tp": 2, "ep": 2, "etp": 1}),
}


def world_size(mesh: dict[str, int]) -> int:
    return mesh.get("tp", 1) * mesh.get("pp", 1) * mesh.get("cp", 1) * mesh.get("dp", 1)


def write_case(directory: Path, case: str) -> Path:
    """The case's HF config.json and a spec (megatron trainer -> vLLM TP1) in ``directory``; the spec path."""
    from weightbridge.testing._internal.vllm_selfcheck import hf_config

    kind, overrides, mesh = CASES[case]
    directory.mkdir(parents=True, exist_ok=True)
    hf_config(kind, **overrides).save_pretrained(directory)
    spec = {"version": 1, "model": {"config": str((directory / "config.json").resolve())},
            "trainer": {"preset": "megatron", "mesh": dict(mesh), "params": {"local_spec": True, "moe_grouped_gemm": False}},
            "rollout": {"preset": "vllm", "mesh": {"tp": 1}}}
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def introspect_rank(job: dict[str, Any]) -> dict[str, Any]:
    """One rank: build, introspect, diff against the preset; returns the IR (JSON) and the diff."""
    from transformers import AutoConfig

    from weightbridge.probe.diff import diff_layouts, format_diff
    from weightbridge.spec.resolve import resolve_spec
    from weightbridge.integrations.megatron.cpu_trainer import MegatronWorld
    from weightbridge.transport.store import open_store

    kind, overrides, mesh = CASES[job["case"]]
    store = open_store("127.0.0.1", job["port"], is_master=False, timeout_s=60)
    hf = AutoConfig.from_pretrained(job["dir"])
    world = MegatronWorld(hf, rank=job["rank"], world_size=world_size(mesh), tp=mesh.get("tp", 1),
                          pp=mesh.get("pp", 1), ep=mesh.get("ep", 1), etp=mesh.get("etp"), store=store,
                          prefix=f"{job['case']}/world/")
    try:
        want = resolve_spec(job["spec"]).trainer.ranks[job["rank"]]
        got = world.layout
        diffs = diff_layouts(got, want)
        shapes = {n: list(t.shape) for n, t in world.params.items()}
        return {"layout": got.to_json(), "diff": format_diff(diffs), "ndiff": len(diffs), "shapes": shapes}
    finally:
        world.close()



def param_sync_rank(rank: int, port: int) -> list[tuple]:
    """One rank of a dp-2 Megatron-Core world under Megatron's ``DistributedDataParallel`` with the
    distributed optimizer's parameter layout and ``overlap_param_gather``. Megatron's optimizer needs
    CUDA, so its step is done as it does it: each rank updates its own shard of every bucket's
    parameter buffer (+1), after a real forward, backward and reduce-scatter. Then the real checks."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from weightbridge.errors import StaleParameters
    from weightbridge.integrations.megatron import gather_params, param_sync_hook, pending_param_gathers
    from weightbridge.integrations.megatron.cpu_trainer import MegatronWorld
    from weightbridge.testing._internal.vllm_selfcheck import hf_config
    from weightbridge.transport.store import open_store

    store = open_store("127.0.0.1", port, is_master=False, timeout_s=60)
    world = MegatronWorld(hf_config("qwen2", num_key_value_heads=2), rank=rank, world_size=2, store=store)
    ddp = DistributedDataParallel(config=world.config, ddp_config=DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_param_gather=True, overlap_grad_reduce=False), module=world.model)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    s = ids.shape[1] - 1
    pos, mask = torch.arange(s).unsqueeze(0).expand(2, s), torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), 1)
    events: list[tuple] = []

    def replicas_agree() -> bool:
        try:
            world.full_tensors(check_replicas=True)
            return True
        except RuntimeError:
            return False

    for step in range(2):
        ddp.zero_grad_buffer()
        ddp(input_ids=ids[:, :-1], position_ids=pos, attention_mask=mask, labels=ids[:, 1:]).mean().backward()
        ddp.finish_grad_sync()
        with torch.no_grad():  # the distributed optimizer's step: this rank's shard of each parameter buffer
            for group in ddp.bucket_groups + ddp.expert_parallel_bucket_groups:
                for bucket in group.buckets:
                    n = bucket.param_data.numel() // 2
                    bucket.param_data.view(-1)[rank * n:(rank + 1) * n] += 1.0
        events.append(("stale", step, pending_param_gathers([ddp]), replicas_agree()))
        try:
            param_sync_hook(ddp, gather=False, rank=f"trainer {rank}")()
            events.append(("refused", step, None))
        except StaleParameters as exc:
            events.append(("refused", step, str(exc)))
        (param_sync_hook(ddp) if step else lambda: gather_params([ddp]))()  # a DDP, or a list of model chunks
        events.append(("gathered", step, pending_param_gathers(ddp), replicas_agree()))
    world.close()
    return events
