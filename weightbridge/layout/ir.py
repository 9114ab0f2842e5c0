"""The layout IR: how each rank's local tensors are made of canonical boxes.

Frames:

* **canonical** — a HuggingFace checkpoint tensor, by name, in its full shape
  (``model.layers.3.self_attn.q_proj.weight``, ``[4096, 4096]``).
* **local** — one tensor a runtime rank really holds (``...qkv_proj.weight`` on
  vLLM TP rank 1), in its local shape.

A :class:`Piece` says that ``canonical_box`` of the canonical tensor is stored in
``local_box`` of the local tensor, element for element in row-major order (the
canonical box read with its dims reversed when ``transpose``). Local elements no
piece covers are padding (e.g. padded vocabulary rows) and map to nothing.

Everything here is immutable, hashable and JSON-serialisable; no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from weightbridge.layout.box import Box, box_numel, format_box

Side = str  # "trainer" | "rollout"

# Element sizes in bytes of the dtypes a spec may name (torch spelling).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e8m0fnu": 1,  # a power of two (an exponent byte): UE8M0 scales
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "float8_e4m3fn",
    "long": "int64",
    "int": "int32",
    # safetensors header spellings
    "F64": "float64",
    "F32": "float32",
    "BF16": "bfloat16",
    "F16": "float16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def normalize_dtype(name: str) -> str | None:
    """Canonical torch spelling of a dtype name (``bf16`` -> ``bfloat16``), or None if unknown."""
    name = name.removeprefix("torch.")
    if name in DTYPE_BYTES:
        return name
    return DTYPE_ALIASES.get(name)


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[name]


# Floating dtypes that round-trip through each other by a plain cast (fp8 needs scales: never a
# checkpoint cast), narrowest first within a width.
_CAST_FLOATS = ("float16", "bfloat16", "float32", "float64")


def checkpoint_cast(local: str, checkpoint: str) -> str | None:
    """The checkpoint's dtype when a value must pass through it before landing in a ``local``
    tensor, else None.

    An engine loading a checkpoint reads each value in the checkpoint's dtype and casts it to its
    own: a ``bfloat16`` checkpoint tensor that the engine keeps in ``float32`` (Qwen3-Next's
    ``A_log`` in vLLM) holds bf16-rounded values. A transfer delivers the same values by moving
    such a tensor in the checkpoint's dtype (the sender casts down, the receiver up). Only for a
    checkpoint float strictly narrower than the local float; equal widths (fp16 vs bf16) and
    anything else move in the local dtype, as before.
    """
    if local in _CAST_FLOATS and checkpoint in _CAST_FLOATS and DTYPE_BYTES[checkpoint] < DTYPE_BYTES[local]:
        return checkpoint
    return None


def wire_dtype(local: str, via: str | None) -> str:
    """The dtype a value crosses the wire in: ``via`` (a :func:`checkpoint_cast`) or the receiver's."""
    return via or local
class QuantScheme(NamedTuple):
    """How a rollout serves a quantised weight: FP8 E4M3 values and one scale per block.

    ``kind`` ``"block"``: a scale per ``block = (rows, cols)`` block of the weight (DeepSeek's
    128x128 ``weight_scale_inv``, vLLM's ``fp8_per_block``); ``"row"``: a scale per output row
    (per channel, ``block = (1, 0)``: the whole row). ``scales``: ``"float32"`` (amax / 448) or
    ``"ue8m0"`` (rounded up to a power of two); ``scale_dtype``: how a scale is stored,
    ``float32`` or ``float8_e8m0fnu`` (UE8M0 packed: the exponent byte, one byte per scale).
    The arithmetic is :mod:`weightbridge.quant`'s (vLLM's own). Pure data; :mod:`.quant` uses it.
    """

    kind: str = "block"
    block: tuple[int, int] = (128, 128)
    scales: str = "float32"
    scale_dtype: str = "float32"
    dtype: str = "float8_e4m3fn"

    @property
    def suffix(self) -> str:
        """What a weight's name gets for its scale tensor's (``q_proj.weight`` -> ``q_proj.weight_scale_inv``)."""
        return "_scale_inv" if self.kind == "block" else "_scale"

    def __str__(self) -> str:
        grid = f"{self.block[0]}x{self.block[1]} blocks" if self.kind == "block" else "per row"
        return f"fp8 e4m3, {grid}, {self.scales} scales ({self.scale_dtype})"


class QuantizedWeight(NamedTuple):
    """Canonical weight ``weight`` (2-D, ``shape``, its canonical dtype the one it is quantised from)
    served as ``scheme.dtype`` plus the canonical scale tensor ``scale`` derived from it.

    ``source`` (rollout sides): the dtypes its values pass through before quantising, in order
    (the checkpoint's, then the engine's unquantised one): what the sender casts to first.
    """

    weight: str
    scale: str
    shape: tuple[int, ...]
    scheme: QuantScheme
    source: tuple[str, ...] = ()


class CanonicalTensor(NamedTuple):
    """One HF checkpoint tensor: the unit of the canonical coordinate system."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CanonicalModel:
    """All canonical tensors of a model, sorted by name, plus normalised config params.

    ``params`` holds the integers and booleans rules may refer to (``num_layers``,
    ``num_kv_heads``, ``num_experts``, ``tie_word_embeddings``, ...). ``quant``: the weights
    stored quantised (:mod:`weightbridge.layout.quant`); their scale tensors are among ``tensors``.
    """

    tensors: tuple[CanonicalTensor, ...]
    params: tuple[tuple[str, Any], ...] = ()
    source: str = ""
    quant: tuple[QuantizedWeight, ...] = ()
    _by_name: dict[str, CanonicalTensor] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tensors})

    def __getitem__(self, name: str) -> CanonicalTensor:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[CanonicalTensor]:
        return iter(self.tensors)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def total_bytes(self) -> int:
        return sum(_numel(t.shape) * dtype_bytes(t.dtype) for t in self.tensors)


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Piece(NamedTuple):
    """``canonical_box`` of tensor ``canonical`` is stored in ``local_box`` of the owning local tensor."""

    canonical: str
    canonical_box: Box  # frame: the canonical tensor, full shape
    local_box: Box  # frame: the local tensor
    transpose: bool = False  # local holds the canonical box with dims reversed

    @property
    def numel(self) -> int:
        return box_numel(self.local_box)

    def __str__(self) -> str:
        t = ".T" if self.transpose else ""
        return f"{format_box(self.local_box)} <- {self.canonical}{format_box(self.canonical_box)}{t}"


class LocalTensor(NamedTuple):
    """One tensor a rank holds, and the canonical pieces it is made of."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        return _numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class RankLayout:
    """What one rank of one side holds. ``instance`` groups rollout ranks into engines.

    ``rank`` is the rank within its side (trainer ranks ``0..S-1``; rollout ranks
    ``0..R-1`` numbered instance-major), ``local_rank`` the rank within its instance.
    """

    side: Side
    rank: int
    tensors: tuple[LocalTensor, ...]
    instance: int = 0
    local_rank: int = 0
    coords: tuple[tuple[str, int], ...] = ()  # mesh coordinates, for humans

    def tensor(self, name: str) -> LocalTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def pieces(self) -> Iterator[tuple[LocalTensor, Piece]]:
        for t in self.tensors:
            for p in t.pieces:
                yield t, p

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "rank": self.rank,
            "instance": self.instance,
            "local_rank": self.local_rank,
            "coords": dict(self.coords),
            "tensors": [tensor_to_json(t) for t in self.tensors],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RankLayout:
        return cls(
            side=obj["side"],
            rank=int(obj["rank"]),
            instance=int(obj.get("instance", 0)),
            local_rank=int(obj.get("local_rank", 0)),
            coords=tuple(sorted((k, int(v)) for k, v in obj.get("coords", {}).items())),
            tensors=tuple(tensor_from_json(t) for t in obj["tensors"]),
        )

    def digest(self) -> str:
        return layout_hash([self])

    def __str__(self) -> str:
        lines = [f"{self.side} rank {self.rank} (instance {self.instance}, local rank {self.local_rank})"]
        for t in self.tensors:
            lines.append(f"  {t.name} {list(t.shape)} {t.dtype}")
            lines.extend(f"    {p}" for p in t.pieces)
        return "\n".join(lines)


def tensor_to_json(t: LocalTensor) -> dict[str, Any]:
    """The documented JSON form of a local tensor (``weightbridge explain --json``)."""
    return {
        "name": t.name,
        "shape": list(t.shape),
        "dtype": t.dtype,
        "pieces": [
            {
                "canonical": p.canonical,
                "canonical_box": [list(iv) for iv in p.canonical_box],
                "local_box": [list(iv) for iv in p.local_box],
                "transpose": p.transpose,
            }
            for p in t.pieces
        ],
    }


def tensor_from_json(obj: dict[str, Any]) -> LocalTensor:
    return LocalTensor(
        name=obj["name"],
        shape=tuple(int(x) for x in obj["shape"]),
        dtype=obj["dtype"],
        pieces=tuple(
            Piece(
                canonical=p["canonical"],
                canonical_box=tuple((int(a), int(b)) for a, b in p["canonical_box"]),
                local_box=tuple((int(a), int(b)) for a, b in p["local_box"]),
                transpose=bool(p.get("transpose", False)),
            )
            for p in obj["pieces"]
        ),
    )


def checkpoint_casts(model: CanonicalModel, ranks: Iterable[RankLayout]) -> tuple[tuple[str, str], ...]:
    """The ``(canonical name, checkpoint dtype)`` pairs whose values pass through the checkpoint's
    dtype on their way into ``ranks``' local tensors (:func:`checkpoint_cast`), sorted."""
    out: dict[str, str] = {}
    seen: set[int] = set()
    for r in ranks:
        if id(r.tensors) in seen:  # ranks with the same tensors share the tuple
            continue
        seen.add(id(r.tensors))
        for t in r.tensors:
            if t.dtype not in ("float32", "float64"):  # nothing narrower to cast through (the usual bf16 case)
                continue
            for p in t.pieces:
                via = checkpoint_cast(t.dtype, model[p.canonical].dtype) if p.canonical in model else None
                if via is not None:
                    out[p.canonical] = via
    return tuple(sorted(out.items()))


def layout_hash(layouts: Iterable[RankLayout]) -> str:
    """Stable sha256 (hex, 16 chars) of a list of rank layouts; identical across processes."""
    h = hashlib.sha256()
    for lay in layouts:
        h.update(json.dumps(lay.to_json(), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class SideLayout:
    """Every rank of one side. Rollout ranks are grouped into ``num_instances`` engines.

    ``casts`` (rollout side): the canonical tensors whose values pass through the checkpoint's
    narrower dtype before this side's (:func:`checkpoint_cast`), as sorted ``(name, dtype)``
    pairs; the planner moves them in that dtype.
    ``quant`` (rollout side): the canonical weights this side receives quantised by the sender
    (FP8 values and their scale tensors: :mod:`weightbridge.layout.quant`), sorted by name.
    """

    side: Side
    ranks: tuple[RankLayout, ...]
    num_instances: int = 1
    casts: tuple[tuple[str, str], ...] = ()
    quant: tuple[QuantizedWeight, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def instance_ranks(self, instance: int) -> tuple[RankLayout, ...]:
        return tuple(r for r in self.ranks if r.instance == instance)

    def digest(self) -> str:
        return layout_hash(self.ranks)
