"""Pack plan items into wire buffers and unpack them into destination tensors (pure torch).

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

No torch.distributed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from weightbridge.layout.box import Box, box_shape

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
for _name in ("float8_e4m3fn", "float8_e5m2"):
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
