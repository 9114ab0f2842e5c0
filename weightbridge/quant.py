"""The sender's FP8 quantiser (vLLM's arithmetic, bit for bit) and the derived sources it feeds.

Torch only (no torch.distributed, no vLLM). Frames: :mod:`weightbridge.layout.quant` (a quantised
weight ``W``, its blocks and its scale tensor ``S``, all in canonical coordinates).

**The quantiser** reproduces vLLM 0.32's online quantisers, operation for operation, so that FP8
values and scales made here equal what the engine makes of the same weights itself:

* ``kind="block"``: ``vllm.utils.deep_gemm.per_block_cast_to_fp8`` (what ``fp8_per_block`` runs
  in ``process_weights_after_loading``): zero-pad to whole blocks; ``amax = |x|.float().amax()``
  per block, clamped to at least ``1e-4``; ``sf = amax / 448.0`` (a tensor divided by a Python
  float); for UE8M0 ``sf = 2 ** ceil(log2(sf))``; ``x * (1.0 / sf)`` (fp32) cast to
  ``float8_e4m3fn`` (round to nearest even; torch's cast, which never saturates: values stay below
  448 by construction); the scales are ``sf`` as fp32 (``weight_scale_inv``);
* ``kind="row"``: the per-channel quantiser of vLLM's ``fp8_per_channel``: ``amax`` of each row
  (``aminmax``), ``scale = (amax.float() / tensor(448.0)).clamp_min(1 / (tensor(448.0) * 512))``,
  ``(x / scale).clamp_(-448, 448)`` cast to FP8.

Each element and block scale depends only on its block, so quantising block rows in chunks (as
done here, to bound memory) gives the same bits as the whole tensor at once.
``tests/quant/test_quant_vllm.py`` checks equality with vLLM's functions on random tensors
(hypothesis), zeros, denormal-range and extreme values, and tensors cut by shard edges.

**Derived sources** (:func:`quantized_sources`): on a trainer rank, the planner's virtual tensors
``wb:quant:W`` (FP8) and ``wb:quant:S`` (scales) are :class:`DerivedSource` objects that quantise on
read: indexing one with a box gathers the whole blocks around it from the rank's own pieces of
``W`` (any local tensors, cast through ``QuantizedWeight.source``: the checkpoint's dtype, then the
engine's), quantises them and returns the box. Transient memory: the blocks of one read, quantised
:data:`CHUNK_ELEMS` elements at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from weightbridge.layout.box import Box, box_shape, intersect
from weightbridge.layout.ir import Piece, QuantizedWeight, QuantScheme, RankLayout
from weightbridge.layout.quant import FP8_MAX, VIRTUAL, scale_box, scale_shape, weight_box
from weightbridge.plan.geometry import map_to_local
from weightbridge.tensors import read_canonical, torch_dtype

CHUNK_ELEMS = 16 << 20  # weight elements quantised at once (their fp32 temporaries: ~64-128 MB)


def _align(x: int, y: int) -> int:
    return -(-x // y) * y


def _ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(2.0, torch.ceil(torch.log2(x.abs())))


def quantize_blocks(x: torch.Tensor, block: Sequence[int], ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D, any float dtype) -> (FP8 values of ``x``'s shape, fp32 scales per block):
    ``per_block_cast_to_fp8``'s arithmetic (module docstring)."""
    m, n = x.shape
    bm, bn = block
    x_padded = torch.zeros((_align(m, bm), _align(n, bn)), dtype=x.dtype, device=x.device)
    x_padded[:m, :n] = x
    x_view = x_padded.view(-1, bm, x_padded.size(1) // bn, bn)
    x_amax = x_view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = x_amax / FP8_MAX
    sf = _ceil_to_ue8m0(sf) if ue8m0 else sf
    x_scaled = (x_view * (1.0 / sf)).to(torch.float8_e4m3fn)
    return x_scaled.view_as(x_padded)[:m, :n].contiguous(), sf.view(x_view.size(0), x_view.size(2))


def quantize_rows(x: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D) -> (FP8 values, fp32 scales ``[rows, 1]``): vLLM's per-channel arithmetic."""
    fp8_max = torch.tensor(FP8_MAX, device=x.device, dtype=torch.float32)
    lo, hi = x.aminmax(dim=-1, keepdim=True)
    amax = torch.maximum(lo.abs(), hi.abs())
    scale = (amax.to(torch.float32) / fp8_max).clamp_min(1.0 / (fp8_max * 512))
    scale = _ceil_to_ue8m0(scale) if ue8m0 else scale
    return (x / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def quantize(x: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and scales (in ``scheme.scale_dtype``) of 2-D ``x`` under ``scheme``, quantised in
    chunks of whole block rows (same bits as all at once)."""
    if x.dim() != 2:
        raise ValueError(f"quantize takes a 2-D tensor, got shape {list(x.shape)}")
    m, k = x.shape
    rows = 1 if scheme.kind == "row" else scheme.block[0]
    step = max(rows, (CHUNK_ELEMS // max(1, k)) // rows * rows)
    q = torch.empty((m, k), dtype=torch_dtype(scheme.dtype), device=x.device)
    s = torch.empty(scale_shape((m, k), scheme), dtype=torch_dtype(scheme.scale_dtype), device=x.device)
    ue8m0 = scheme.scales == "ue8m0"
    for r in range(0, m, step):
        xs = x[r:r + step]
        qs, ss = quantize_rows(xs, ue8m0) if scheme.kind == "row" else quantize_blocks(xs, scheme.block, ue8m0)
        q[r:r + step] = qs
        s[r // rows:r // rows + ss.shape[0]] = ss.to(s.dtype)
    return q, s


# ---- derived sources on a trainer rank ---------------------------------------------------------


class DerivedSource:
    """A trainer rank's FP8 values (``scales=False``) or scales (``True``) of one quantised weight,
    in that canonical tensor's frame, computed on read (module docstring). ``parts``: the rank's
    ``(local tensor, piece)`` pairs of the weight. Duck-typed as far as the executor reads a source
    tensor: ``shape``, ``dtype``, ``device`` and ``self[slices]`` (a new tensor)."""

    def __init__(self, q: QuantizedWeight, scales: bool, parts: Sequence[tuple[torch.Tensor, Piece]]) -> None:
        self.q, self.scales, self.parts = q, scales, list(parts)
        sch = q.scheme
        self.shape = torch.Size(scale_shape(q.shape, sch) if scales else q.shape)
        self.dtype = torch_dtype(sch.scale_dtype if scales else sch.dtype)
        self.device = self.parts[0][0].device if self.parts else torch.device("cpu")
        self.source = [torch_dtype(d) for d in q.source] or [self.parts[0][0].dtype if self.parts else torch.float32]

    def __getitem__(self, index: Any) -> torch.Tensor:
        box: Box = tuple((s.start or 0, s.stop if s.stop is not None else n) for s, n in zip(index, self.shape))
        sch = self.q.scheme
        sbox = box if self.scales else scale_box(box, sch)
        wbox = weight_box(sbox, self.q.shape, sch)
        q, s = quantize(self._gather(wbox), sch)
        if self.scales:
            return s
        (a, _), (c, _) = wbox
        return q[box[0][0] - a:box[0][1] - a, box[1][0] - c:box[1][1] - c]

    def _gather(self, wbox: Box) -> torch.Tensor:
        """The weight's elements in ``wbox`` (canonical frame) in the engine's dtype, read from the
        rank's pieces through the source dtypes."""
        out = torch.empty(box_shape(wbox), dtype=self.source[-1], device=self.device)
        filled = 0
        for tensor, piece in self.parts:
            sub = intersect(piece.canonical_box, wbox)
            if sub is None:
                continue
            for csub, lbox in map_to_local(sub, piece):
                vals = read_canonical(tensor, lbox, piece.transpose, box_shape(csub))
                for dt in self.source[:-1]:
                    vals = vals.to(dt)
                rel = tuple(slice(a - o, z - o) for (a, z), (o, _) in zip(csub, wbox))
                out[rel].copy_(vals)
                filled += vals.numel()
        if filled < out.numel():  # held_blocks planned only whole held blocks: a mismatch is a bug
            raise RuntimeError(f"{self.q.weight}{list(wbox)}: this rank holds {filled} of its {out.numel()} elements")
        return out


def quantized_sources(tensors: Mapping[str, torch.Tensor], layout: RankLayout,
                      quant: Sequence[QuantizedWeight]) -> Mapping[str, Any]:
    """``tensors`` (a trainer rank's, by local name) plus a :class:`DerivedSource` for each virtual
    tensor the planner gives this rank (:func:`weightbridge.layout.quant.sender_sources`); ``tensors``
    itself when ``quant`` is empty."""
    if not quant:
        return tensors
    table = {q.weight: q for q in quant}
    parts: dict[str, list[tuple[torch.Tensor, Piece]]] = {}
    for t in layout.tensors:
        for p in t.pieces:
            if p.canonical in table:
                parts.setdefault(p.canonical, []).append((tensors[t.name], p))
    out: dict[str, Any] = dict(tensors)
    for w, ps in parts.items():
        q = table[w]
        out[VIRTUAL + w] = DerivedSource(q, False, ps)
        out[VIRTUAL + q.scale] = DerivedSource(q, True, ps)
    return out


def iter_quantized(full: Mapping[str, torch.Tensor], quant: Sequence[QuantizedWeight]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a checkpoint with ``quant``'s weights quantised: each quantised weight's FP8
    values then its scale tensor, every other tensor as it is (``full``: canonical name -> tensor,
    in the dtype the values pass through, e.g. bf16). What an FP8 checkpoint written from a trainer's
    weights holds."""
    table = {q.weight: q for q in quant}
    for name, t in full.items():
        q = table.get(name)
        if q is None:
            yield name, t
            continue
        x = t
        for dt in q.source:
            x = x.to(torch_dtype(dt))
        values, scales = quantize(x, q.scheme)
        yield name, values
        yield q.scale, scales
