"""Self-application: weightbridge's own SGLang integration passes the conformance suite through the plugin.

Rollout: one real ``sglang.Engine`` (CPU, TP 1) per scenario, started inside the suite's
rank processes, with weightbridge's custom weight loader
(``weightbridge.integrations.sglang.conformance``). Trainer: 2 FSDP2 ranks of the same tiny Qwen2
model (``wbconf_sglang_sides``). Without SGLang the module skips, unless
``WEIGHTBRIDGE_REQUIRE_SGLANG=1`` (CI's SGLang phase sets it) makes that a failure.
"""

import pytest

from weightbridge.testing._internal.optional import require

require("sglang", extra="sglang", reason="the SGLang conformance self-application needs SGLang (.ci/sglang_venv.sh)")

from weightbridge.testing import ConformanceSuite  # noqa: E402 - after the skip above

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


class TestSGLangConformance(ConformanceSuite):
    # One engine per scenario: an SGLang start costs 25-150 s on 2 shared cores, and a second instance
    # would double every scenario. Late joining is the bridge's membership protocol, the same for
    # every engine (the vLLM self-application runs it with two engines).
    known_gaps = {"membership.late-joiner.receives": "one SGLang instance per scenario (machine time); "
                                                     "needs >= 2 instances"}
    timeout_s = 10.0
    startup_s = 300.0  # an SGLang engine start (scheduler process, loader probe) on a small, shared CPU machine
    preload = ("transformers.models.qwen2.modeling_qwen2", "torch.distributed.fsdp")
