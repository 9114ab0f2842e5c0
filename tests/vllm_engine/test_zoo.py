"""The architecture zoo (issue 31): FSDP2 trainer -> vLLM-CPU for every architecture the engines
serve, bitwise against a fresh load of the trainer's checkpoint; this file runs the rotating slice.

Each case runs :mod:`weightbridge.testing._internal.zoo_check` in a subprocess: a tiny random bf16
checkpoint of the architecture, 2 FSDP2 ranks (float32 master, real AdamW steps, buffers drifting)
pushing 2 versions through weightbridge into a vLLM engine at TP 1 or 2; what is asserted:
``zoo_check.report_problems``. Which cases: ``weightbridge.testing._internal.zoo_ci`` (this file: a
rotating slice; DeepSeek-V3, every run: ``test_zoo_deepseek.py``; ``WEIGHTBRIDGE_ZOO=all`` runs
every case). Without vLLM these tests skip, unless ``WEIGHTBRIDGE_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("vllm", extra="vllm-cpu", reason="the architecture zoo needs vLLM")

import torch  # noqa: E402 - after the optional-dependency gate

from weightbridge.testing._internal.zoo_check import report_problems, run_in_subprocess  # noqa: E402
from weightbridge.testing._internal.zoo_ci import Case, always, selected  # noqa: E402

HOST_AMX = bool(torch.cpu._is_amx_tile_supported())
CASES = [c for c in selected(Path(__file__).resolve().parents[2], HOST_AMX) if c not in always(HOST_AMX)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_zoo_trainer_to_vllm_bitwise(case: Case, tmp_path: Path) -> None:
    report = run_in_subprocess(case.arch, case.tp, case.amx, tmp_path)
    assert report_problems(report, case.tp, case.amx) == []
