"""Process body for ``test_local_plane_mp.py``: one member of a colocated data plane used directly (no bridge)."""

from __future__ import annotations

import os
from typing import Any

import torch

from weightbridge.plan import build_plan, network_model
from weightbridge.plan.network import local_copy_of
from weightbridge.spec.resolve import check_text
from weightbridge.sync.auth import Signer
from weightbridge.tensors import canonical_tensors, empty_like_layout, layout_mismatches, materialize
from weightbridge.transport.local_plane import LocalDataPlane
from weightbridge.transport.store import open_store


def member(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg``: spec, port, side, rank, versions, ``away`` (bridge ranks stated on another host: their
    pairs go over Gloo). A rollout rank streams (``tensors`` are shapes only) into a dict, then compares it
    bitwise with the canonical weights of each version."""
    r, problems = check_text(cfg["spec"])
    assert r is not None, problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=r.sync.round_bytes, receiver_dedup="off",
                      network=network_model(r.network, local_copy=local_copy_of("shm")))
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    me = rank if side == "trainer" else S + rank
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=20)
    plane = LocalDataPlane(kind="shm", signer=Signer(os.environ["WEIGHTBRIDGE_SECRET"].encode()), checksums=True)
    here = plane.identity()
    plane.place({b: here.model_copy(update={"host": here.host + "-away"}) if b in cfg["away"] else here
                 for b in range(S + R)})
    plane.connect(store, prefix="t/", bridge_rank=me, world_size=S + R, num_trainers=S, timeout_s=20)
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    out: dict[str, Any] = {"all_local": plane.all_local, "local": sorted(plane.local), "runs": []}
    try:
        for v in cfg["versions"]:
            canon = canonical_tensors(r.canonical, seed=v)
            if side == "trainer":
                st = plane.run(plan, side=side, rank=rank, tensors=materialize(layout, canon), dst=None, tag="t",
                               version=v)
                out["runs"].append({"version": v})
                continue
            got: dict[str, torch.Tensor] = {}
            writes: list[str] = []

            def sink(name: str, t: torch.Tensor) -> None:
                writes.append(name)
                got[name] = t.clone()

            shapes = empty_like_layout(layout, device="meta")
            st = plane.run(plan, side=side, rank=rank, tensors=shapes, dst=None, tag="t", version=v, stream=sink)
            out["runs"].append({"version": v, "bad": layout_mismatches(layout, got, canon), "writes": writes,
                                "names": sorted(shapes), "stream_bytes": st.stream_bytes,
                                "wire_received": st.wire_received, "bytes_received": st.bytes_received,
                                "shard_bytes": sum(t.numel() * t.element_size() for t in shapes.values())})
    finally:
        plane.close()
    return out
