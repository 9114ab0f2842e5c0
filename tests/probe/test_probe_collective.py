"""Probing a loader that runs a collective: two Gloo ranks stay in lockstep (full iterator)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from weightbridge.localrun import launch

from ._collective import run_stage


@pytest.mark.multiprocess
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with Gloo")
def test_pp_broadcast_loader(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    results = launch(run_stage, [(0, store), (1, store)], timeout_s=60, preload=["tests.probe._zoo"])
    outs = [r.unwrap() for r in results]
    for rank, out in enumerate(outs):
        assert out["diff"] == "", f"rank {rank}:\n{out['diff']}"
        assert out["ok"]
        assert out["chunks"] == 2 and out["calls"] == 2
        assert out["engine_calls"] == out["broadcasts"] == 3  # 2 probe calls + 1 verification, each broadcasting once
    assert "model.embed_tokens.weight" in outs[1]["tensors"]  # the tied copy on the last stage
