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

