"""The toy model's checkpoint tensors (the canonical frame weightbridge.yaml lists inline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToyConfig:
    vocab: int = 100
    hidden: int = 32
    kv: int = 16  # rows of k and v (grouped-query attention)
    ffn: int = 64
    layers: int = 2

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor name -> full shape."""
        h = self.hidden
        out = {"tok_emb.weight": (self.vocab, h)}
        for i in range(self.layers):
            p = f"layers.{i}."
            out |= {
                p + "attn.q.weight": (h, h), p + "attn.k.weight": (self.kv, h), p + "attn.v.weight": (self.kv, h),
                p + "attn.o.weight": (h, h), p + "ffn.gate.weight": (self.ffn, h), p + "ffn.up.weight": (self.ffn, h),
                p + "ffn.down.weight": (h, self.ffn), p + "norm.weight": (h,),
            }
        return out | {"final_norm.weight": (h,), "head.weight": (self.vocab, h)}
