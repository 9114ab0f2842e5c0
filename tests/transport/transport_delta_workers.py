"""Process entry points for ``test_delta_mp.py``: one executor per rank moves many versions with
``delta`` on, each version an AdamW-like step of an fp32 master (sparse changes in bf16)."""

from __future__ import annotations

import time
from typing import Any

import torch

from weightbridge.transport import Executor, TransportError, create_bridge_group, open_store
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize, needed_names, torch_dtype

from transport_workers import make_plan, resolve  # noqa: I001 - sibling module (tests/transport)

FILL = 3.0


def step(canon: dict[str, torch.Tensor], version: int, lr: float) -> None:
    """One deterministic "optimizer step" (the same in every process): every fp32 element moves by
    ``lr`` in a random direction, so only the elements that cross a bf16 rounding boundary change."""
    g = torch.Generator().manual_seed(7919 * version)
    for name in sorted(canon):
        t = canon[name]
        t += lr * (torch.randint(0, 2, t.shape, generator=g, dtype=torch.float32) * 2 - 1)


def delta_transfer(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank: ``cfg['versions']`` versions, each verified bitwise on rollout ranks; per-version stats.

    ``cfg['lr']``: per version, or one value; ``cfg['touch']``: a version before which the rollout rank
    writes its destination itself (the next delta must be refused).
    """
    r = resolve(cfg["yaml"])
    plan = make_plan(r, cfg["plan"])
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    timeout_s = cfg.get("timeout_s", 20.0)
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=timeout_s)
    group = create_bridge_group(store, rank=rank if side == "trainer" else S + rank, world_size=S + R,
                                num_trainers=S, backend="gloo", timeout_s=timeout_s, prefix="wb/delta")
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    canon = canonical_tensors(r.canonical, seed=3, dtype="float32", names=needed_names(layout))
    for t in canon.values():
        t.mul_(0.02)
    ex = Executor(plan, group, side=side, rank=rank, device="cpu", chunk_bytes=cfg.get("chunk_bytes", 64 << 20),
                  checksums=cfg.get("checksums", True), overlap=cfg.get("overlap", "inline"), delta=cfg["delta"])
    dst = empty_like_layout(layout, fill=FILL) if side == "rollout" else None
    out: dict[str, Any] = {"side": side, "rank": rank, "versions": []}
    lrs = cfg["lr"] if isinstance(cfg["lr"], list) else [cfg["lr"]] * cfg["versions"]
    try:
        for v in range(1, cfg["versions"] + 1):
            if v > 1:
                step(canon, v, lrs[v - 1])
            if side == "rollout" and cfg.get("touch") == v:
                with torch.no_grad():
                    next(iter(dst.values())).view(-1)[0] += 1  # someone else wrote the destination
            if side == "trainer":
                stats = ex.run(materialize(layout, canon), version=v)
                rec = {"version": v}
            else:
                stats = ex.run(dst, version=v)
                # What an engine loading the checkpoint holds: values through the checkpoint's dtype
                # where the rollout's is wider (SideLayout.casts), then the rollout's.
                through = {n: canon[n].to(torch_dtype(d)) for n, d in r.rollout.casts if n in canon}
                want = materialize(layout, {**canon, **through}, fill=FILL)
                rec = {"version": v, "diff": diff_tensors(dst, want)}
            rec.update({k: getattr(stats, k) for k in ("delta_buckets", "full_buckets", "changed_elements",
                                                       "compared_elements", "wire_bytes_sent", "wire_bytes_received",
                                                       "bytes_sent", "bytes_received", "peak_buffer_bytes",
                                                       "delta_cache_bytes")})
            out["versions"].append(rec)
    except TransportError as exc:
        out["error"] = (type(exc).__name__, str(exc), time.time())
    finally:
        group.close(abort="error" in out)
    return out
