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
# Progress counters the parent reads from the store it hosts (``weightbridge.demo.run._Progress``).
PROGRESS_PREFIX = "wb-demo-progress/"


def progress_key(what: str) -> str:
    """``trainer-up`` / ``rollout-up`` (ranks ready), ``pushed`` (versions trainer 0 pushed), ``applied/V``."""
    return PROGRESS_PREFIX + what


def _canonical_path(workdir: str, version: int) -> Path:
    return Path(workdir) / f"canonical_v{version}.pt"


def trainer_main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One trainer rank: its own world (Gloo default group) + FSDP2 model; push after each step."""
    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.demo.fsdp2 import FSDP2World
    from weightbridge.demo.model import build_fsdp2_model
    from weightbridge.tensors import layout_mismatches
    from weightbridge.transport.store import open_store

    rank, world = job["rank"], job["num_trainers"]
    store = open_store(job["host"], job["port"], is_master=False, timeout_s=job["timeout_s"])
    # The training framework's own world: never touched by the bridge.
    trainer = FSDP2World(build_fsdp2_model, rank=rank, world_size=world, store=store, prefix="demo/trainer-world/")
    opt = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    local = trainer.tensors
    store.add(progress_key("trainer-up"), 1)

    records: list[dict[str, Any]] = []
    version = 0
    for mode in job["modes"]:
        resolved = load_spec(job["specs"][mode])
        layout = resolved.trainer.ranks[rank]
        options = BridgeOptions(prefix=PHASE_PREFIX.format(mode=mode))
        bridge = TrainerBridge.from_spec(resolved, rank=rank, tensors=local(), store=store, options=options)
        for _ in range(job["steps"]):
            version += 1
            g = torch.Generator().manual_seed(version)
            ids = torch.randint(0, resolved.canonical.param_dict.get("vocab_size", 4000), (4, 32), generator=g)
            t0 = time.perf_counter()
            loss = trainer.step(opt, ids)
            train_s = time.perf_counter() - t0
            # Verification only: the full canonical tensors (a collective over the trainer world).
            full = trainer.full_tensors(t.name for t in resolved.canonical.tensors)
            layout_bad = layout_mismatches(layout, local(), full)
            if rank == 0:
                tmp = _canonical_path(job["workdir"], version).with_suffix(".tmp")
                torch.save(full, tmp)
                os.replace(tmp, _canonical_path(job["workdir"], version))
            stats = bridge.push(version, tensors=local())
            if rank == 0:
                store.add(progress_key("pushed"), 1)
            records.append({
                "mode": mode, "version": version, "epoch": stats.epoch, "wire_bytes": stats.wire_bytes,
                "bytes_sent": stats.bytes_sent, "seconds": stats.seconds, "transfer_s": stats.transfer_s,
                "wait_s": stats.wait_s, "gbps": stats.gbps, "loss": loss, "train_s": train_s,
                "trainer_layout_ok": not layout_bad, "layout_problems": layout_bad,
            })
        bridge.close()
    trainer.close()
    return records


def rollout_main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rollout rank (one TP worker of one engine instance): serve, poll, apply, verify."""
    from weightbridge.bridge import BridgeOptions, RolloutBridge, load_spec
    from weightbridge.tensors import empty_like_layout, layout_mismatches
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
            store.add(progress_key("rollout-up"), 1)
        # Staging follows the mode: sync: the engine is paused for the update, receive in place (no
        # extra memory); async: keep serving from the live weights while the update lands in a staging copy.
        options = BridgeOptions(prefix=PHASE_PREFIX.format(mode=mode))
        bridge = RolloutBridge.from_spec(resolved, rank=rank, tensors=live, store=store, options=options)
        staging = bridge.staging
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
            bad = layout_mismatches(layout, live, canonical)
            store.add(progress_key(f"applied/{v}"), 1)
            stall = bridge.last_apply_s + (rec.transfer_s if (rec is not None and not staging) else 0.0)
            records.append({
                "mode": mode, "version": v, "verified": not bad, "problems": bad, "stall_s": stall,
                "apply_s": bridge.last_apply_s, "bytes_received": rec.bytes_received if rec else 0,
            })
            if v >= last:
                break
        bridge.close()
    return records
