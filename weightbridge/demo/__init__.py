"""``weightbridge demo``: FSDP2 trainer ranks push real optimizer updates to vLLM-style rollout ranks.

See :mod:`weightbridge.demo.run` for what runs and how it is verified.
"""

from weightbridge.demo.run import run_demo

__all__ = ["run_demo"]
