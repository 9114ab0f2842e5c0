"""The demo's processes: trainer ranks (FSDP2, real optimizer steps) and rollout ranks (vLLM-style TP).

Each process body returns plain dicts (one per push or per applied version) to the parent.
Verification: after each optimizer step the trainer ranks gather the full canonical tensors
(``DTensor.full_tensor()``, for verification only; the transfer itself never gathers) and
trainer 0 saves them; every rollout rank compares each version it applies, bitwise, piece by
piece through its layout IR.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

PHASE_PREFIX = "wb-demo-{mode}"


def _canonical_path(workdir: str, version: int) -> Path:
    return Path(workdir) / f"canonical_v{version}.pt"


def trainer_main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One trainer rank: its own world (Gloo default group) + FSDP2 model; push after each step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from weightbridge.bridge import TrainerBridge, load_spec
    from weightbridge.demo.model import build_fsdp2_model
    from weightbridge.sync.verify import mismatches
    from weightbridge.transport.store import open_store

    rank, world = job["rank"], job["num_trainers"]
    store = open_store(job["host"], job["port"], is_master=False, timeout_s=job["timeout_s"])
    # The training framework's own world: never touched by the bridge.
    dist.init_process_group("gloo", store=dist.PrefixStore("demo/trainer-world/", store), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = build_fsdp2_model(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = dict(model.named_parameters())

    def local() -> dict[str, torch.Tensor]:
        return {name: p.to_local() for name, p in params.items()}

    records: list[dict[str, Any]] = []
    version = 0
    for mode in job["modes"]:
        resolved = load_spec(job["specs"][mode])
        layout = resolved.trainer.ranks[rank]
        bridge = TrainerBridge.from_spec(
            resolved, rank=rank, tensors=local(), store=store, prefix=PHASE_PREFIX.format(mode=mode), heartbeat_s=0.5
        )
        for _ in range(job["steps"]):
            version += 1
            g = torch.Generator().manual_seed(version)
            ids = torch.randint(0, resolved.canonical.param_dict.get("vocab_size", 4000), (4, 32), generator=g)
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            train_s = time.perf_counter() - t0
            # Verification only: the full canonical tensors (a collective over the trainer world).
            full = {t.name: params[t.name].full_tensor().detach() for t in resolved.canonical.tensors}
            layout_bad = mismatches(layout, local(), full)
            if rank == 0:
                tmp = _canonical_path(job["workdir"], version).with_suffix(".tmp")
                torch.save(full, tmp)
                os.replace(tmp, _canonical_path(job["workdir"], version))
            stats = bridge.push(version, tensors=local())
            records.append({
                "mode": mode, "version": version, "epoch": stats.epoch, "wire_bytes": stats.wire_bytes,
                "bytes_sent": stats.bytes_sent, "seconds": stats.seconds, "transfer_s": stats.transfer_s,
                "wait_s": stats.wait_s, "gbps": stats.gbps, "loss": loss.item(), "train_s": train_s,
                "trainer_layout_ok": not layout_bad, "layout_problems": layout_bad,
            })
        bridge.close()
    dist.destroy_process_group()
    return records


def rollout_main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rollout rank (one TP worker of one engine instance): serve, poll, apply, verify."""
    from weightbridge.bridge import RolloutBridge, load_spec
    from weightbridge.sync.verify import mismatches
    from weightbridge.transport.localrun import empty_like_layout
    from weightbridge.transport.store import open_store

    rank = job["rank"]
    store = open_store(job["host"], job["port"], is_master=False, timeout_s=job["timeout_s"])
    records: list[dict[str, Any]] = []
    last = 0
    live: dict[str, torch.Tensor] | None = None
    for mode in job["modes"]:
        resolved = load_spec(job["specs"][mode])
        layout = resolved.rollout.ranks[rank]
        if live is None:
            live = empty_like_layout(layout)  # the engine's parameters, in the vLLM layout
        # sync: the engine is paused for the update, receive in place (no extra memory);
        # async: keep serving from the live weights while the update lands in a staging copy.
        staging = mode == "async"
        bridge = RolloutBridge.from_spec(
            resolved, rank=rank, tensors=live, store=store, staging=staging,
            prefix=PHASE_PREFIX.format(mode=mode), heartbeat_s=0.5,
        )
        last += job["steps"]
        deadline = time.monotonic() + job["timeout_s"]
        serve_w = live["model.layers.0.self_attn.qkv_proj.weight"]
        x = torch.ones(8, serve_w.shape[1], dtype=serve_w.dtype)
        while time.monotonic() < deadline:
            if staging:  # "generate" from the live weights while the update lands in staging
                x = torch.tanh(x @ serve_w.T)[:, : serve_w.shape[1]]
                time.sleep(0.002)
            if not bridge.poll():
                time.sleep(0.001)
                continue
            v = bridge.apply()
            rec = bridge.last_receive
            canonical = torch.load(_canonical_path(job["workdir"], v))
            bad = mismatches(layout, live, canonical)
            stall = bridge.last_apply_s + (rec.transfer_s if (rec is not None and not staging) else 0.0)
            records.append({
                "mode": mode, "version": v, "verified": not bad, "problems": bad, "stall_s": stall,
                "apply_s": bridge.last_apply_s, "bytes_received": rec.bytes_received if rec else 0,
            })
            if v >= last:
                break
        bridge.close()
    return records
