"""Quantised rollout targets in spec resolution (pure): which weights, and whether the layouts allow it.

Called by :func:`weightbridge.spec.resolve.check_text` around the expansion pass:

1. :func:`declared_model` (after the canonical pass): the canonical model with the weights the
   rollout receives quantised at the sender, their scale tensors added
   (:func:`weightbridge.layout.quant.quantize_model`). From the spec's ``rollout.quantization``
   (``at: sender``), or from a pre-quantised checkpoint (the canonical source already carries
   ``quant``; then ``rollout.quantization`` may only restate it). ``at: engine`` changes nothing
   that moves: the engine quantises unquantised weights itself (its format is still checked
   against the engine at init: :func:`engine_model`).
2. Both sides expand against the model without scale tensors (scales are derived, never laid out).
3. :func:`quantized_sides` (after expansion): the rollout layout with FP8 and scale local tensors
   (:func:`~weightbridge.layout.quant.quantize_rollout`), and the check that every block of every
   quantised weight is held whole by some trainer rank (the rank that quantises it).
"""

from __future__ import annotations

from weightbridge.layout.box import format_box
from weightbridge.layout.ir import CanonicalModel, QuantScheme, SideLayout
from weightbridge.layout.quant import (
    VIRTUAL,
    quantize_model,
    quantize_rollout,
    select_weights,
    sender_sources,
    unheld_blocks,
)
from weightbridge.spec.models import QuantizationSpec, SideSpec

PATH = "$.rollout.quantization"


def scheme_of(q: QuantizationSpec) -> QuantScheme:
    if q.block == "row":
        return QuantScheme(kind="row", block=(1, 0), scales=q.scales, scale_dtype=q.scale_dtype)
    return QuantScheme(kind="block", block=(int(q.block[0]), int(q.block[1])), scales=q.scales,
                       scale_dtype=q.scale_dtype)


def engine_model(canonical: CanonicalModel, q: QuantizationSpec) -> CanonicalModel:
    """``canonical`` (unquantised) with the weights ``q`` names quantised: what the engine serves,
    whoever quantises (``at: engine`` included). Raises ``ValueError`` as :func:`quantize_model`."""
    return quantize_model(canonical, select_weights(canonical, q.weights, q.exclude), scheme_of(q))


def declared_model(canonical: CanonicalModel, rollout: SideSpec | None,
                   add: "callable") -> CanonicalModel | None:  # type: ignore[valid-type]
    """The canonical model of the transfer (module docstring, step 1), or None after reporting a
    problem through ``add(path, message, hint)``."""
    decl = rollout.quantization if isinstance(rollout, SideSpec) else None
    if canonical.quant:  # a pre-quantised checkpoint: the engine loads FP8 weights and their scales
        if decl is None:
            return canonical
        if decl.at == "engine":
            add(f"{PATH}.at", "the checkpoint stores FP8 weights: the engine loads them quantised, it does not "
                              "quantise", "at: sender (or leave rollout.quantization out: the checkpoint implies it)")
            return None
        want, have = scheme_of(decl), canonical.quant[0].scheme
        if want != have:
            add(PATH, f"the checkpoint's weights are {have}, the spec says {want}",
                "leave rollout.quantization out, or state the checkpoint's format")
            return None
        return canonical
    if decl is None:
        return canonical
    names = select_weights(canonical, decl.weights, decl.exclude)
    if not names:
        add(f"{PATH}.weights", "no canonical weight matches", "globs over canonical names, e.g. '*.layers.*.weight' "
            "(weightbridge explain lists them); leave weights out for the decoder layers' linear weights")
        return None
    if decl.at == "engine":
        return canonical
    try:
        return quantize_model(canonical, names, scheme_of(decl))
    except ValueError as exc:
        add(PATH, str(exc), "exclude that weight")
        return None


def quantized_sides(model: CanonicalModel, trainer: SideLayout, rollout: SideLayout,
                    add: "callable") -> SideLayout | None:  # type: ignore[valid-type]
    """The rollout layout receiving ``model.quant`` quantised (module docstring, step 3), or None
    after reporting its problems and the blocks no trainer rank holds whole."""
    quantized, problems = quantize_rollout(rollout, model)
    for msg in problems[:8]:
        add(PATH, msg, "quantised local tensors must be cut on the block grid (every quantised matrix dim a "
            "multiple of the block on each rank); or exclude the weight")
    if len(problems) > 8:
        add(PATH, f"and {len(problems) - 8} more local tensor(s) cannot hold quantised weights")
    if problems:
        return None
    unheld = unheld_blocks(sender_sources(trainer, quantized.quant), quantized.quant)
    if unheld:
        first = sorted(unheld)[0]
        add(PATH, f"{len(unheld)} quantised weight(s) have blocks no trainer rank holds whole, e.g. {first} "
                  f"({unheld[first]} elements{_holders(trainer, first)}): no rank can quantise them",
            "at: engine (bf16 on the wire), or a trainer mesh whose shards are whole blocks (multiples of the block)")
        return None
    return quantized


def _holders(trainer: SideLayout, weight: str) -> str:
    """``; held by rank 0 [[0, 192], ...] and rank 1 [...]`` for a message (first few pieces)."""
    out = []
    for r in trainer.ranks:
        for t in r.tensors:
            if t.name.startswith(VIRTUAL):
                continue
            out.extend(f"rank {r.rank} {format_box(p.canonical_box)}" for p in t.pieces if p.canonical == weight)
        if len(out) >= 3:
            break
    return f"; held as {', '.join(out[:3])}" if out else ""
