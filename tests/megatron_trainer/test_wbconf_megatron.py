"""The conformance suite with the ready-made Megatron-Core trainer side (weightbridge.testing._internal.megatron).

Trainer: 2 Megatron-Core ranks at TP 2 (tiny Qwen2, local layer spec, Gloo); rollout: vLLM-style
layout-only stand-ins, 2 instances at TP 1 (the real vLLM rollout has its own suite, tests/conformance/vllm_suite).
Without Megatron-Core this module skips, unless ``WEIGHTBRIDGE_REQUIRE_MEGATRON=1``.
"""

import pytest

from weightbridge.testing import ConformanceSuite
from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

require("megatron.core", extra="megatron", reason="the Megatron-Core trainer side needs Megatron-Core")


class TestMegatronTrainerConformance(ConformanceSuite):
    known_gaps = {
        "layout.rollout.probe-agrees": "the rollout ranks are layout-only stand-ins with no load_weights of their "
        "own; this class checks the Megatron trainer side (the vLLM suite probes the real loader)",
    }
    timeout_s = 6.0
    startup_s = 60.0
    preload = ("megatron.core", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
               "weightbridge.testing._internal.megatron", "weightbridge.integrations.megatron.introspect")
