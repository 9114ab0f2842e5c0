"""Run ``vllm_selfcheck_main.py`` in a subprocess (vLLM spawns its workers, so the driver must be a
``__main__``) and return its report; shared by the vLLM selfcheck tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MAIN = Path(__file__).with_name("vllm_selfcheck_main.py")


def run_selfcheck(tmp_path: Path, argv: list[str], **env: str) -> tuple[dict, Path]:
    """``argv``: kind, tp, steps[, transport]; ``env`` added to the environment. Returns (report, probe cache)."""
    cache = tmp_path / "cache"
    full_env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(cache), "VLLM_CPU_KVCACHE_SPACE": "1",
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env}
    out = tmp_path / "report.json"
    kind, tp, *rest = argv
    proc = subprocess.run([sys.executable, str(MAIN), kind, tp, str(tmp_path), str(out), *rest],
                          capture_output=True, text=True, timeout=600, env=full_env, check=False,
                          start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[selfcheck]"))
    assert proc.returncode == 0 and out.exists(), f"{summary}\n{proc.stderr[-4000:]}"
    print(summary)
    return json.loads(out.read_text()), cache
