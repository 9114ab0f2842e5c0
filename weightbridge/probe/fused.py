"""Fused parameters read from transformers' own conversion mapping (transformers >= 5).

transformers 5 builds some parameters from several checkpoint tensors while loading: each MoE
layer's experts are stacked and concatenated (Qwen3-MoE's ``mlp.experts.gate_up_proj [E, 2I, H]``
is ``MergeModulelist(dim=0)`` of the per-expert ``gate_proj.weight`` / ``up_proj.weight`` [I, H],
then ``Concatenate(dim=1)`` of the two; ``mlp.experts.down_proj [E, H, I]`` is
``MergeModulelist(dim=0)`` of ``down_proj.weight``). The source of truth for that is
``transformers.conversion_mapping.get_checkpoint_conversion_mapping(model_type)``, the
``WeightConverter`` list ``from_pretrained`` applies; :func:`fused_params` interprets it for the
live parameter names and shapes, and :func:`fused_pieces` turns a rank's held indices of such a
parameter into per-expert, per-part pieces in the frame the ``fsdp2`` preset's ``stack:`` /
``concat:`` rules use: ``canonical_box`` over the 2-D checkpoint tensor, ``local_box`` over the
3-D local tensor with length 1 on the expert dim.

Interpreted: ``MergeModulelist(dim >= 0)`` alone (one source pattern) or followed by
``Concatenate(dim >= 0)`` on another dim (several source patterns, equal parts: the split
transformers itself uses to save, ``Chunk``); ``WeightRenaming`` undone with transformers'
own reverse transform. Any other operation on a live parameter is a :class:`FusedError` naming
the parameter and the operation, never a guess. Root models only (a sub-model's scoped mapping,
as in vision-language models, is not read). Pure except :func:`fused_params`, which imports
transformers (lazily); any rank may call both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import product

from weightbridge.layout.ir import Piece

# a checkpoint name pattern this module reads literally: dot-separated words, "*" the expert index
_PLAIN = re.compile(r"^\.?(\w+|\*)(\.(\w+|\*))*$")


class FusedError(ValueError):
    """transformers builds a live parameter with a conversion this module does not interpret."""


@dataclass(frozen=True)
class FusedParam:
    """A live parameter transformers builds from per-expert checkpoint tensors.

    ``parts``: checkpoint name templates (``{expert}`` the expert index), concatenated in order
    along ``concat_dim`` of the fused tensor (None: one part); ``expert_dim``: the dim holding
    the expert index (``MergeModulelist``'s); ``shape``: the fused (global) shape.
    """

    name: str
    parts: tuple[str, ...]
    expert_dim: int
    concat_dim: int | None
    shape: tuple[int, ...]

    def canonical(self, part: int, expert: int) -> str:
        return self.parts[part].replace("{expert}", str(expert))


def fused_params(model_type: str, shapes: Mapping[str, Iterable[int]]) -> dict[str, FusedParam]:
    """The parameters of ``shapes`` (live name -> global shape) that transformers' conversion
    mapping for ``model_type`` builds from per-expert checkpoint tensors; {} without a mapping.
    Raises :class:`FusedError` for a conversion of a live parameter that is not interpreted."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    mapping = get_checkpoint_conversion_mapping(model_type) or []
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    out: dict[str, FusedParam] = {}
    for name, shape in shapes.items():
        for conv in converters:  # transformers applies at most one converter per key
            hit = _match(conv, name)
            if hit is not None:
                out[name] = _interpret(conv, name, tuple(int(n) for n in shape), hit, renamings)
                break
    return out


def _match(conv, name: str) -> tuple[str, str] | None:
    """(prefix, suffix) of ``name`` around the converter's target pattern, as the forward
    ``WeightConverter.convert`` partitions the full name on it; None when it does not occur."""
    if len(conv.target_patterns) != 1:
        return None  # one-to-many (a split): never builds one fused parameter
    target = conv.target_patterns[0].replace("\\.", ".")
    if not _PLAIN.match(target) or "*" in target:
        return None
    at = name.find(target)
    if at < 0:
        return None
    return name[:at], name[at + len(target):]


def _refuse(name: str, what: str, conv) -> FusedError:
    return FusedError(f"{name}: transformers' conversion {conv!r} with {what} is not interpreted by the probe "
                      f"(write rules for this parameter, or pass name_map / fused for it)")


def _interpret(conv, name: str, shape: tuple[int, ...], hit: tuple[str, str], renamings: list) -> FusedParam:
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = list(conv.operations)
    sources = [s.replace("\\.", ".") for s in conv.source_patterns]
    if not ops or type(ops[0]) is not MergeModulelist or not isinstance(ops[0].dim, int) or ops[0].dim < 0:
        raise _refuse(name, f"operation {ops[0] if ops else None!r}", conv)
    expert_dim = ops[0].dim
    concat_dim = None
    if len(ops) == 2:
        cat = ops[1]
        if (type(cat) is not Concatenate or cat.num_shards_attribute is not None or not isinstance(cat.dim, int)
                or cat.dim < 0 or cat.dim == expert_dim):
            raise _refuse(name, f"operation {cat!r}", conv)
        concat_dim = cat.dim
    elif len(ops) > 2 or len(sources) != 1:
        raise _refuse(name, f"operations {ops!r}", conv)
    if concat_dim is None and len(sources) != 1:
        raise _refuse(name, f"{len(sources)} sources and no Concatenate", conv)
    for s in sources:
        if not _PLAIN.match(s) or s.split(".").count("*") != 1:
            raise _refuse(name, f"source pattern {s!r} (not a plain name with one '*' expert index)", conv)
    if max(expert_dim, concat_dim or 0) >= len(shape):
        raise _refuse(name, f"a dim beyond its shape {list(shape)}", conv)
    if concat_dim is not None and shape[concat_dim] % len(sources):
        raise _refuse(name, f"dim {concat_dim} of {shape[concat_dim]} not split evenly into {len(sources)} parts", conv)
    prefix, suffix = hit
    parts = tuple(_undo_renamings(prefix + s.replace("*", "{expert}") + suffix, renamings) for s in sources)
    return FusedParam(name, parts, expert_dim, concat_dim, shape)


def _undo_renamings(key: str, renamings: list) -> str:
    """The checkpoint name before transformers' renamings (its own reverse transforms, last first)."""
    for ren in reversed(renamings):
        key, _ = ren.reverse_transform().rename_source_key(key)
    return key


def fused_pieces(fp: FusedParam, per_dim: list[list[int]]) -> list[Piece]:
    """Pieces of a rank's local tensor of ``fp`` that holds global indices ``per_dim[d]`` along
    each dim (row-major outer product, as :func:`weightbridge.probe.dtensor.dim_indices` gives):
    one per held expert, part and run of consecutive indices along the other dims."""
    nparts = len(fp.parts)
    part_len = fp.shape[fp.concat_dim] // nparts if fp.concat_dim is not None else 0
    per_dim_runs = []
    for d, idx in enumerate(per_dim):
        runs = index_runs(idx)
        if d == fp.expert_dim:  # one expert per piece
            runs = [(j, j + 1, g + j - a) for a, b, g in runs for j in range(a, b)]
        elif d == fp.concat_dim:  # a run never crosses a part boundary
            runs = [r for a, b, g in runs for r in _split_at(a, b, g, part_len)]
        per_dim_runs.append(runs)
    pieces = []
    for combo in product(*per_dim_runs):
        part = combo[fp.concat_dim][2] // part_len if fp.concat_dim is not None else 0
        cbox = []
        for d, (a, b, g) in enumerate(combo):
            if d == fp.expert_dim:
                continue
            off = part * part_len if d == fp.concat_dim else 0
            cbox.append((g - off, g - off + b - a))
        lbox = tuple((a, b) for a, b, _ in combo)
        pieces.append(Piece(fp.canonical(part, combo[fp.expert_dim][2]), tuple(cbox), lbox, False))
    return pieces


def _split_at(a: int, b: int, g: int, step: int) -> list[tuple[int, int, int]]:
    out = []
    while a < b:
        n = min(b - a, step - g % step)
        out.append((a, a + n, g))
        a, g = a + n, g + n
    return out


def index_runs(idx: list[int]) -> list[tuple[int, int, int]]:
    """(local start, local stop, global start) of runs of consecutive increasing indices."""
    out: list[tuple[int, int, int]] = []
    for j, g in enumerate(idx):
        if out and out[-1][1] == j and out[-1][2] + (j - out[-1][0]) == g:
            out[-1] = (out[-1][0], j + 1, out[-1][2])
        else:
            out.append((j, j + 1, g))
    return out
