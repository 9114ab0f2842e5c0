"""ToyEngine: one tensor-parallel rank of an inference engine, in the engine's own layout.

``wqkv`` = this rank's rows of [q; k; v]; ``wo_t`` = its input columns of o, stored transposed;
``w13`` = its rows of [gate; up]; ``w2`` = its input columns of down; the vocabulary is padded
to a multiple of 128 rows and split by rows; norms are replicated. bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from toyrl.model import ToyConfig

VOCAB_MULTIPLE = 128


class ToyEngine:
    """TP rank ``tp_rank`` of ``tp_size``; ``params`` are the live weights generation reads."""

    gate_first = True  # w13 = [gate; up]

    def __init__(self, cfg: ToyConfig, *, tp_rank: int, tp_size: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.cfg, self.tp_rank, self.tp = cfg, tp_rank, tp_size
        h, t = cfg.hidden, tp_size
        vocab_rows = -(-cfg.vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE // t
        shapes = {"engine.embed": (vocab_rows, h), "engine.lm_head": (vocab_rows, h), "engine.final_norm": (h,)}
        for i in range(cfg.layers):
            p = f"engine.layers.{i}."
            shapes |= {p + "wqkv": ((h + 2 * cfg.kv) // t, h), p + "wo_t": (h // t, h),
                       p + "w13": (2 * cfg.ffn // t, h), p + "w2": (h, cfg.ffn // t), p + "norm": (h,)}
        self.params = {n: torch.zeros(s, dtype=dtype) for n, s in shapes.items()}

    def _rows(self, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp, 0)[self.tp_rank]

    def _cols(self, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp, 1)[self.tp_rank]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The engine's loader: checkpoint tensors (full) into this rank's fused, sharded weights."""
        cfg, h = self.cfg, self.cfg.hidden
        for name, full in weights:
            if name in ("tok_emb.weight", "head.weight"):
                dst = self.params["engine.embed" if name == "tok_emb.weight" else "engine.lm_head"]
                start = self.tp_rank * dst.shape[0]
                rows = full[start:start + dst.shape[0]]
                dst[: rows.shape[0]].copy_(rows)
                continue
            if name == "final_norm.weight":
                self.params["engine.final_norm"].copy_(full)
                continue
            parts = name.split(".")  # layers.L.norm.weight | layers.L.GROUP.KIND.weight
            layer, kind = parts[1], parts[-2]
            p = f"engine.layers.{layer}."
            if kind in ("q", "k", "v"):
                q, kv = h // self.tp, cfg.kv // self.tp
                start = {"q": 0, "k": q, "v": q + kv}[kind]
                part = self._rows(full)
                self.params[p + "wqkv"][start:start + part.shape[0]].copy_(part)
            elif kind == "o":
                self.params[p + "wo_t"].copy_(self._cols(full).t())
            elif kind in ("gate", "up"):
                half = cfg.ffn // self.tp
                first = "gate" if self.gate_first else "up"
                start = 0 if kind == first else half
                self.params[p + "w13"][start:start + half].copy_(self._rows(full))
            elif kind == "down":
                self.params[p + "w2"].copy_(self._cols(full))
            elif kind == "norm":
                self.params[p + "norm"].copy_(full)
            else:
                raise KeyError(f"ToyEngine cannot load {name}")

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Stand-in for one engine step that reads the live weights."""
        w = self.params["engine.layers.0.w13"]
        return torch.tanh(x.to(w.dtype) @ w.T)[:, : x.shape[1]]
