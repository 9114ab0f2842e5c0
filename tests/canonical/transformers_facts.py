"""What the installed transformers declares (its answers changed between 5.19 and 5.24)."""

from __future__ import annotations


def deepseek_router_weight_fp32() -> bool:
    """True when transformers keeps DeepSeek-V3's router ``mlp.gate.weight`` in float32
    (``_keep_in_fp32_modules_strict`` names ``gate``; 5.24 does, 5.19 keeps only the bias)."""
    from transformers import DeepseekV3ForCausalLM

    return "gate" in (DeepseekV3ForCausalLM._keep_in_fp32_modules_strict or ())
