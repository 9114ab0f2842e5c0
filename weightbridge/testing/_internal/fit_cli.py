"""The command-line half of the live-fit tests: `weightbridge fit` of a draft to live ranks' layout
JSONs, then `weightbridge diff` of each live rank against the fitted spec (used by the Megatron-Core
and the FSDP2 Qwen3-MoE live-fit tests, which assert the in-process half themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def fit_and_diff_cli(workdir: Path, draft: str, layouts: Sequence[dict[str, Any]], *, side: str = "trainer") -> str:
    """Write ``draft`` and each rank's layout JSON (``RankLayout.to_json()``, rank = index) under
    ``workdir``, run `weightbridge fit --side SIDE --probe R=FILE ...` and `weightbridge diff` of every
    rank against the fitted spec; AssertionError with the command's output on a non-zero exit.
    Returns the fitted spec's text."""
    (workdir / "draft.yaml").write_text(draft)
    probes = []
    for r, layout in enumerate(layouts):
        (workdir / f"live{r}.json").write_text(json.dumps(layout))
        probes += ["--probe", f"{r}={workdir / f'live{r}.json'}"]
    cli = [sys.executable, "-m", "weightbridge"]
    fitted = workdir / "fitted.yaml"
    done = subprocess.run(cli + ["fit", str(workdir / "draft.yaml"), "--side", side, *probes, "-o", str(fitted)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(len(layouts)):
        same = subprocess.run(cli + ["diff", str(workdir / f"live{r}.json"), f"{fitted}:{side}:{r}"],
                              check=False, capture_output=True, text=True, timeout=120)
        assert same.returncode == 0, f"rank {r}: " + same.stdout + same.stderr
    return fitted.read_text()
