"""Torch tensor helpers (pure torch, no torch.distributed): the one place for dtype names and box copies.

* dtype names: :func:`torch_dtype` (``"bfloat16"`` -> ``torch.bfloat16``) and :func:`dtype_name`
  (the inverse), the only conversion between the IR's dtype strings and torch dtypes;
* box copies: :func:`read_canonical` / :func:`write_canonical` (a local box as canonical elements),
  :func:`pack_items` / :func:`unpack_items` (plan items into and out of wire buffers),
  :func:`read_elements` / :func:`write_elements` (single elements of a box, for delta updates) and
  :func:`apply_local_copies`;
* tensors of a layout: :func:`empty_like_layout` (a receiver's destination), :func:`materialize`
  (a rank's local tensors from full canonical tensors), :func:`canonical_tensor(s)` (deterministic
  values, the same in every process), :func:`bitwise_equal` / :func:`diff_tensors`.

The wire format is the one of :mod:`weightbridge.plan.types`: a bucket's buffer is its
items back to back, each item being the elements of its ``canonical_box`` in
**canonical row-major order**, at the item's ``dtype``, no padding.

Reading a local box as canonical elements (:func:`read_canonical`):

* ``region = local[box]`` is a strided view (no copy);
* without transpose, the region holds the canonical box in row-major correspondence, so
  ``region.reshape(canonical_shape)`` is the canonical order. When the shapes differ
  (a stacked expert slot ``[1, I, H]`` vs ``[I, H]``, a ``[24]`` view vs ``[4, 6]``) the
  reshape is a view whenever the strides allow it, else a copy of *the region only*;
* with transpose, the region holds the canonical box with dims reversed:
  ``region.reshape(reversed(canonical_shape)).permute(reversed dims)``.

Writing is the inverse (:func:`write_canonical`): the canonical-order values are put in
region order (permuted view when transposed) and copied into the region with
``Tensor.copy_``, which casts to the destination dtype. No full local tensor is ever
gathered or copied; every copy touches the boxes only.
"""


from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from weightbridge.layout.box import Box, box_shape
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, RankLayout

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of an IR dtype name (``"bfloat16"`` -> ``torch.bfloat16``)."""
    try:
        return _DTYPES[name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """The IR spelling of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def _reversed_dims(n: int) -> tuple[int, ...]:
    return tuple(range(n - 1, -1, -1))


def read_canonical(tensor: torch.Tensor, box: Box, transpose: bool, canonical_shape: Sequence[int]) -> torch.Tensor:
    """``box`` of ``tensor`` as a tensor of ``canonical_shape`` in canonical element order.

    A view of ``tensor`` when the strides allow it; otherwise a copy of the box only.
    """
    region = tensor[_slices(box)]
    shape = tuple(canonical_shape)
    if transpose:
        return region.reshape(shape[::-1]).permute(_reversed_dims(len(shape)))
    return region.reshape(shape)


def write_canonical(tensor: torch.Tensor, box: Box, transpose: bool, values: torch.Tensor) -> None:
    """Write ``values`` (canonical shape and order) into ``box`` of ``tensor``, casting to its dtype."""
    region = tensor[_slices(box)]
    if transpose:
        values = values.permute(_reversed_dims(values.dim()))
    if tuple(values.shape) != tuple(region.shape):
        values = values.reshape(region.shape)  # row-major correspondence; copies the item at most
    region.copy_(values)


def _wire_view(buf: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor | None:
    """``buf[offset:offset+nbytes]`` viewed as ``dtype`` of ``shape``, or None when misaligned."""
    raw = buf[offset : offset + nbytes]
    size = torch.empty((), dtype=dtype).element_size()
    if size > 1 and (raw.storage_offset() % size or nbytes % size):
        return None
    return raw.view(dtype).view(tuple(shape))


def direct_view(tensor: torch.Tensor | None, box: Box, transpose: bool, dtype: str,
                device: torch.device) -> torch.Tensor | None:
    """``box`` of ``tensor`` as a flat ``uint8`` view holding the box's elements in canonical
    row-major order at ``dtype``, or None when it is not one (transposed, strided, another dtype
    or device): a wire message can then be sent from or received into the tensor itself."""
    if not isinstance(tensor, torch.Tensor) or transpose or tensor.device != device or dtype_name(tensor.dtype) != dtype:
        return None  # (a derived source, weightbridge.quant.DerivedSource, is computed: never zero-copy)
    region = tensor[_slices(box)]
    if not region.is_contiguous():
        return None
    return region.reshape(-1).view(torch.uint8)


def _check_room(buf: torch.Tensor, need: int) -> None:
    if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
        raise ValueError("wire buffer must be a contiguous 1-D uint8 tensor")
    if buf.numel() < need:
        raise ValueError(f"wire buffer of {buf.numel()} bytes is too small for {need} bytes of items")


def items_nbytes(items: Iterable) -> int:
    return sum(it.nbytes for it in items)


def pack_items(items: Sequence, tensors: Mapping[str, torch.Tensor], out: torch.Tensor, offset: int = 0) -> int:
    """Pack ``items`` (plan ``WireItem``s) read from ``tensors`` into ``out`` from ``offset``.

    Per item: ``src_box`` of ``tensors[item.src_tensor]`` (dims reversed when ``src_transpose``),
    cast to ``item.dtype``, copied at the running offset. Returns the end offset.
    """
    _check_room(out, offset + items_nbytes(items))
    for it in items:
        shape = box_shape(it.canonical_box)
        src = read_canonical(tensors[it.src_tensor], it.src_box, it.src_transpose, shape)
        dt = torch_dtype(it.dtype)
        view = _wire_view(out, offset, it.nbytes, dt, shape)
        if view is not None:
            view.copy_(src)
        else:  # item starts at an offset not aligned to its element size: stage through a temporary
            out[offset : offset + it.nbytes].copy_(src.to(dt).contiguous().view(-1).view(torch.uint8))
        offset += it.nbytes
    return offset


def unpack_items(items: Sequence, buf: torch.Tensor, tensors: Mapping[str, torch.Tensor], offset: int = 0) -> int:
    """Unpack ``items`` from ``buf`` (from ``offset``) into ``dst_box`` of ``tensors[item.dst_tensor]``.

    Casts from the wire dtype to each destination tensor's dtype. Returns the end offset.
    """
    _check_room(buf, offset + items_nbytes(items))
    for it in items:
        shape = box_shape(it.canonical_box)
        dt = torch_dtype(it.dtype)
        view = _wire_view(buf, offset, it.nbytes, dt, shape)
        if view is None:
            view = buf[offset : offset + it.nbytes].clone().view(dt).view(shape)
        write_canonical(tensors[it.dst_tensor], it.dst_box, it.dst_transpose, view)
        offset += it.nbytes
    return offset


def _unravel(flat: torch.Tensor, shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Row-major multi-indices of ``flat`` in ``shape`` (torch.unravel_index imports sympy on first use)."""
    out = []
    for n in reversed(tuple(shape)[1:]):
        out.append(flat % n)
        flat = flat // n
    out.append(flat)
    return tuple(reversed(out))


def _element_index(tensor: torch.Tensor, box: Box, transpose: bool, canonical_shape: Sequence[int],
                   flat: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The region ``tensor[box]`` (a view) and the indices into it of canonical row-major element
    indices ``flat`` (int64) of a box of ``canonical_shape`` (dims reversed in the region when ``transpose``)."""
    region = tensor[_slices(box)]
    if region.dim() == 0:
        region = region.unsqueeze(0)
    shape = tuple(canonical_shape)
    if transpose and len(shape) > 1:
        coords = _unravel(flat, shape)
        f = coords[-1]
        for c, n in zip(reversed(coords[:-1]), shape[-2::-1]):
            f = f * n + c
        flat = f
    if region.is_contiguous():  # row ranges of a contiguous tensor: one flat index
        return region.view(-1), (flat,)
    return region, _unravel(flat, tuple(region.shape))


def read_elements(tensor: torch.Tensor, box: Box, transpose: bool, canonical_shape: Sequence[int],
                  flat: torch.Tensor) -> torch.Tensor:
    """Elements ``flat`` (canonical row-major indices within the box) of ``box`` of ``tensor``, as a new 1-D tensor."""
    region, idx = _element_index(tensor, box, transpose, canonical_shape, flat)
    return torch.index_select(region, 0, idx[0]) if len(idx) == 1 else region[idx]


def write_elements(tensor: torch.Tensor, box: Box, transpose: bool, canonical_shape: Sequence[int],
                   flat: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` (1-D, one per index of ``flat``) into those elements of ``box`` of ``tensor``
    (the inverse of :func:`read_elements`; casts to the tensor's dtype). Touches those elements only."""
    region, idx = _element_index(tensor, box, transpose, canonical_shape, flat)
    if len(idx) == 1 and region.element_size() == 1 and region.dtype.is_floating_point:
        # FP8 (quantised targets): torch has no index_copy_ for it; the same bytes as uint8
        region.view(torch.uint8).index_copy_(0, idx[0], values.to(region.dtype).view(torch.uint8))
    elif len(idx) == 1:
        region.index_copy_(0, idx[0], values.to(region.dtype))
    else:
        region.index_put_(idx, values.to(region.dtype))


def apply_local_copies(copies: Iterable, tensors: Mapping[str, torch.Tensor], rank: int | None = None) -> int:
    """Apply plan ``LocalCopy`` entries (``src_box`` of ``src_tensor`` -> ``dst_box`` of ``dst_tensor``).

    With ``rank`` given, only the copies of that rollout rank are applied. Returns how many were.
    """
    n = 0
    for c in copies:
        if rank is not None and c.rank != rank:
            continue
        shape = box_shape(c.canonical_box)
        vals = read_canonical(tensors[c.src_tensor], c.src_box, c.src_transpose, shape)
        if c.src_tensor == c.dst_tensor:
            vals = vals.clone()  # same tensor: never read what this copy overwrites
        write_canonical(tensors[c.dst_tensor], c.dst_box, c.dst_transpose, vals)
        n += 1
    return n


# ---------------------------------------------------------------------------
# tensors of a layout
# ---------------------------------------------------------------------------


def canonical_tensor(t: CanonicalTensor, *, seed: int = 0, dtype: str | None = None, device: Any = "cpu") -> torch.Tensor:
    """Deterministic values for canonical tensor ``t`` (depends on name and seed only)."""
    dt = torch_dtype(dtype or t.dtype)
    g = torch.Generator().manual_seed((zlib.crc32(t.name.encode()) * 1_000_003 + seed) & 0x7FFF_FFFF_FFFF)
    if dt.is_floating_point:
        x = torch.randn(t.shape, generator=g, dtype=torch.float32).to(dt)
    elif dt == torch.bool:
        x = torch.randint(0, 2, t.shape, generator=g).bool()
    else:
        x = torch.randint(-100, 100, t.shape, generator=g).to(dt)
    return x.to(device)


def canonical_tensors(
    model: CanonicalModel,
    *,
    seed: int = 0,
    dtype: str | None = None,
    names: Iterable[str] | None = None,
    device: Any = "cpu",
) -> dict[str, torch.Tensor]:
    """:func:`canonical_tensor` for every tensor of ``model`` (or only ``names``)."""
    wanted = None if names is None else set(names)
    return {
        t.name: canonical_tensor(t, seed=seed, dtype=dtype, device=device)
        for t in model
        if wanted is None or t.name in wanted
    }


def needed_names(layout: RankLayout) -> set[str]:
    """Canonical tensor names a rank's layout is made of."""
    return {p.canonical for _, p in layout.pieces()}


def empty_like_layout(layout: RankLayout, *, device: Any = "cpu", fill: float = 0.0, dtype: str | None = None) -> dict[str, torch.Tensor]:
    """Local tensors of ``layout`` filled with ``fill`` (a receiver's destination before an update)."""
    return {
        t.name: torch.full(t.shape, fill, dtype=torch_dtype(dtype or t.dtype), device=device) for t in layout.tensors
    }


def materialize(
    layout: RankLayout,
    canonical: Mapping[str, torch.Tensor],
    *,
    device: Any = "cpu",
    fill: float = 0.0,
    dtype: str | None = None,
) -> dict[str, torch.Tensor]:
    """The local tensors of ``layout`` (in their IR dtype, or ``dtype``) from full canonical tensors.

    Every piece's ``canonical_box`` is copied into its ``local_box`` (row-major correspondence,
    transposed when the piece says so); elements no piece covers keep ``fill``.
    """
    out = empty_like_layout(layout, device=device, fill=fill, dtype=dtype)
    for t in layout.tensors:
        for p in t.pieces:
            vals = read_canonical(canonical[p.canonical], p.canonical_box, False, box_shape(p.canonical_box))
            write_canonical(out[t.name], p.local_box, p.transpose, vals.to(device))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    size = t.element_size()
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN payloads and -0.0 included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a.cpu()), _bits(b.cpu())))


def diff_tensors(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], limit: int = 5) -> list[str]:
    """Human-readable list of tensors that differ bitwise (empty when all equal)."""
    bad = []
    for name in sorted(set(got) | set(want)):
        if name not in got or name not in want:
            bad.append(f"{name}: {'missing' if name not in got else 'unexpected'}")
        elif not bitwise_equal(got[name], want[name]):
            g, w = got[name], want[name]
            if g.shape == w.shape and g.dtype == w.dtype:
                n = int((_bits(g.cpu()) != _bits(w.cpu())).sum())
                bad.append(f"{name}: {n} of {g.numel()} elements differ")
            else:
                bad.append(f"{name}: {list(g.shape)} {g.dtype} vs {list(w.shape)} {w.dtype}")
        if len(bad) >= limit:
            break
    return bad
