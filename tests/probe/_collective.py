"""A loader that runs a collective inside ``load_weights`` (run in 2 Gloo processes).

Pipeline parallel vLLM-style stages of a tied model: stage 0 holds the embedding and
layer 0, stage 1 layer 1, the final norm and (tied lm_head) its own copy of the
embedding, which stage 0 **broadcasts** to it while loading. Every probe call must see
the embedding on both ranks, or the broadcast would deadlock.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from weightbridge.probe import probe_loader

from ._zoo import VllmLike, expand, qwen_like


class BroadcastingStage(VllmLike):
    def load_one(self, name, w):
        if name == "model.embed_tokens.weight":
            buf = w.clone() if dist.get_rank() == 0 else torch.empty_like(w)
            dist.broadcast(buf, src=0)
            self.broadcasts += 1
            return self._vocab(name, buf)
        return super().load_one(name, w)


def run_stage(rank: int, store: str) -> dict:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    try:
        m = qwen_like(tied=True, vocab=1200)  # two chunks
        eng = BroadcastingStage(m, 1, 0, layers=range(rank, rank + 1), first=True, last=rank == 1)
        eng.broadcasts = 0
        res = probe_loader(m, eng.load_weights, eng.params, rank=rank)
        want = expand("vllm", {"pp": 2}, m).ranks[rank]
        from weightbridge.probe.diff import diff_layouts, format_diff

        return {
            "diff": format_diff(diff_layouts(res.layout, want)),
            "ok": res.ok,
            "calls": res.calls,
            "chunks": res.chunks,
            "engine_calls": eng.calls,
            "broadcasts": eng.broadcasts,
            "tensors": sorted(t.name for t in res.layout.tensors),
        }
    finally:
        dist.destroy_process_group()
