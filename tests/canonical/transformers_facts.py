"""What the installed transformers declares (its answers changed between 5.19 and 5.24)."""

from __future__ import annotations


def deepseek_router_weight_fp32() -> bool:
    """True when transformers keeps DeepSeek-V3's router ``mlp.gate.weight`` in float32
    (``_keep_in_fp32_modules_strict`` names ``gate.weight`` in 5.24; 5.19 keeps only the bias)."""
    from transformers import DeepseekV3ForCausalLM

    keep = DeepseekV3ForCausalLM._keep_in_fp32_modules_strict or ()
    return any(f".{k}." in ".model.layers.3.mlp.gate.weight." for k in keep)
