"""Torch tensor helpers (pure torch, no process group): the one place for dtype names and box copies.

* dtype names: :func:`torch_dtype` (``"bfloat16"`` -> ``torch.bfloat16``) and :func:`dtype_name`
  (the inverse), the only conversion between the IR's dtype strings and torch dtypes;
* box copies: :func:`read_canonical` / :func:`write_canonical` (a local box as canonical elements),
  :func:`pack_items` / :func:`unpack_items` (plan items into and out of wire buffers),
  :func:`read_elements` / :func:`write_elements` (single elements of a box, for delta updates) and
  :func:`apply_local_copies`;
* tensors of a layout: :func:`empty_like_layout` (a receiver's destination), :func:`materialize`
  (a rank's local tensors from full canonical tensors), :func:`canonical_tensor(s)` (deterministic
  values, the same in every process);
* bitwise checks: :func:`bitwise_equal` (bits, not values), :func:`diff_tensors` (by name) and
  :func:`layout_mismatches` (a rank's local tensors against full canonical ones, piece by piece).

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

from weightbridge.layout.box import Box, box_shape, format_box
from weightbridge._torch_compat import foreach_copy
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
    size = dtype.itemsize
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


# Copies per batched call: holding tens of thousands of views for one call cost more on CPU than it
# saved (/tmp microbench, 20000 single-item tensors: 0.65x); CUDA's fast path launches ~100 per kernel.
BATCH = 256


def _flat_range(shape: Sequence[int], box: Box) -> tuple[int, int] | None:
    """``(first element, elements)`` of ``box`` in a C-contiguous tensor of ``shape`` when the box is one
    contiguous range of it (every dim after the first longer than one is whole), else None."""
    lens = [b - a for a, b in box]
    first = next((d for d, n in enumerate(lens) if n > 1), len(lens))
    for d in range(first + 1, len(lens)):
        if box[d][0] != 0 or box[d][1] != shape[d]:
            return None
    start, stride = 0, 1
    for d in range(len(shape) - 1, -1, -1):
        start += box[d][0] * stride
        stride *= shape[d]
    count = 1
    for n in lens:
        count *= n
    return start, count


def copy_runs(items: Sequence, tensors: Mapping[str, torch.Tensor], offset: int, *, dst: bool) -> list[tuple]:
    """``items`` as copies between the wire (from ``offset``) and their tensors (``dst``: the receiver's side).

    Consecutive items whose boxes are contiguous element ranges of one contiguous tensor, following
    each other there as on the wire, at one wire dtype, become one run ``(name, first element,
    elements, dtype, wire offset, wire bytes)`` copied at once (vLLM's fused expert and qkv tensors
    receive many such items in a row); any other item stays ``(item, wire offset)``.
    """
    out: list[tuple] = []
    flat: dict[str, bool] = {}
    for it in items:
        name, box, transpose = (it.dst_tensor, it.dst_box, it.dst_transpose) if dst else (
            it.src_tensor, it.src_box, it.src_transpose)
        rng = None
        if not transpose:
            t = tensors[name]
            if name not in flat:  # a virtual source (quant.DerivedSource: FP8 computed on read) has no storage
                flat[name] = isinstance(t, torch.Tensor) and t.is_contiguous()
            rng = _flat_range(t.shape, box) if flat[name] else None
        if rng is None:
            out.append((it, offset))
        else:
            last = out[-1] if out else None
            if (last is not None and len(last) == 6 and last[0] == name and last[3] == it.dtype
                    and last[1] + last[2] == rng[0] and last[4] + last[5] == offset):
                out[-1] = (name, last[1], last[2] + rng[1], it.dtype, last[4], last[5] + it.nbytes)
            else:
                out.append((name, rng[0], rng[1], it.dtype, offset, it.nbytes))
        offset += it.nbytes
    return out


def pack_items(items: Sequence, tensors: Mapping[str, torch.Tensor], out: torch.Tensor, offset: int = 0) -> int:
    """Pack ``items`` (plan ``WireItem``s) read from ``tensors`` into ``out`` from ``offset``.

    Per item: ``src_box`` of ``tensors[item.src_tensor]`` (dims reversed when ``src_transpose``),
    cast to ``item.dtype``, copied at the running offset; items that are one contiguous range of
    their source together are copied as one (:func:`copy_runs`), and the copies go as one batched
    call (``_torch_compat.foreach_copy``). Returns the end offset.
    """
    end = offset + items_nbytes(items)
    _check_room(out, end)
    dsts, srcs = [], []
    for run in copy_runs(items, tensors, offset, dst=False):
        if len(run) == 2:
            it, off = run
            shape = box_shape(it.canonical_box)
            src = read_canonical(tensors[it.src_tensor], it.src_box, it.src_transpose, shape)
        else:
            name, first, count, _, off, _ = run
            it, shape = None, (count,)
            src = tensors[name].view(-1)[first : first + count]
        dt = torch_dtype(run[0].dtype if it is not None else run[3])
        nbytes = it.nbytes if it is not None else run[5]
        view = _wire_view(out, off, nbytes, dt, shape)
        if view is not None:
            dsts.append(view)
            srcs.append(src)
            if len(dsts) == BATCH:
                foreach_copy(dsts, srcs)
                dsts, srcs = [], []
        else:  # starts at an offset not aligned to its element size: stage through a temporary (dense
            # strides: a size-1 box of a strided tensor counts as contiguous but keeps its stride)
            out[off : off + nbytes].copy_(src.to(dt).reshape(-1).clone(memory_format=torch.contiguous_format)
                                          .view(torch.uint8))
    foreach_copy(dsts, srcs)
    return end


def unpack_items(items: Sequence, buf: torch.Tensor, tensors: Mapping[str, torch.Tensor], offset: int = 0) -> int:
    """Unpack ``items`` from ``buf`` (from ``offset``) into ``dst_box`` of ``tensors[item.dst_tensor]``.

    Casts from the wire dtype to each destination tensor's dtype; items that are one contiguous range
    of their destination together are written as one (:func:`copy_runs`), in one batched call.
    Returns the end offset.
    """
    end = offset + items_nbytes(items)
    _check_room(buf, end)
    dsts, srcs = [], []
    for run in copy_runs(items, tensors, offset, dst=True):
        if len(run) == 2:
            it, off = run
            shape, dt, nbytes = box_shape(it.canonical_box), torch_dtype(it.dtype), it.nbytes
        else:
            name, first, count, dtype, off, nbytes = run
            shape, dt = (count,), torch_dtype(dtype)
        view = _wire_view(buf, off, nbytes, dt, shape)
        if view is None:
            view = buf[off : off + nbytes].clone().view(dt).view(shape)
        if len(run) == 2:
            write_canonical(tensors[it.dst_tensor], it.dst_box, it.dst_transpose, view)
        else:
            dsts.append(tensors[name].view(-1)[first : first + count])
            srcs.append(view)
            if len(dsts) == BATCH:
                foreach_copy(dsts, srcs)
                dsts, srcs = [], []
    foreach_copy(dsts, srcs)
    return end


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


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits, one integer per element where an integer type of its element size exists (else
    one ``uint8`` per byte, flattened: complex128): integer comparison never makes ``-0.0 == 0.0``
    or ``NaN != NaN``, as float comparison does."""
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t
    t = t.contiguous()
    as_int = _INT_OF_SIZE.get(t.element_size())
    return t.view(as_int) if as_int is not None else t.reshape(-1).view(torch.uint8)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits: ``-0.0`` differs from ``0.0``, a NaN equals only a NaN with its
    payload (the one comparison weightbridge's checks use: value equality, ``torch.equal``, says the
    opposite in both cases)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a.detach().cpu()), _bits(b.detach().cpu())))


def layout_mismatches(layout: RankLayout, tensors: Mapping[str, torch.Tensor],
                      canonical: Mapping[str, torch.Tensor], limit: int = 5) -> list[str]:
    """Pieces of ``layout`` whose local values in ``tensors`` differ bitwise (:func:`bitwise_equal`)
    from the full ``canonical`` tensors cast to the local dtype; at most ``limit``, empty when all match.

    Walks the rank's pieces in the layout IR: each piece's canonical box of ``canonical[name]``
    against the local box of ``tensors[local name]`` it lives in (either device; compared on CPU).
    Padding (local elements no piece covers) is neither written nor checked."""
    out: list[str] = []
    for t in layout.tensors:
        local = tensors[t.name]
        for p in t.pieces:
            got = read_canonical(local, p.local_box, p.transpose, box_shape(p.canonical_box))
            want = canonical[p.canonical][_slices(p.canonical_box)].to(local.dtype)
            if not bitwise_equal(got, want):
                out.append(f"{layout.side} {layout.rank} {t.name}{format_box(p.local_box)} != "
                           f"{p.canonical}{format_box(p.canonical_box)}")
                if len(out) >= limit:
                    return out
    return out


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


# ---------------------------------------------------------------------------
# a trainer's tensors
# ---------------------------------------------------------------------------


def trainer_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A trainer rank's tensors by name, as ``TrainerBridge`` takes them: every parameter (a
    DTensor's ``to_local()`` shard; a tied parameter once, under its first name) and every
    persistent buffer, since those are checkpoint tensors too (DeepSeek-V3's and GLM-4-MoE's
    ``mlp.gate.e_score_correction_bias``; ``fully_shard`` leaves buffers whole on every rank).
    Non-persistent buffers (rotary ``inv_freq``) are not in a checkpoint and are left out."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[name] = p.to_local() if hasattr(p, "to_local") else p
    for mod_name, mod in model.named_modules():
        for b_name, b in mod.named_buffers(recurse=False):
            if b is None or b_name in mod._non_persistent_buffers_set:
                continue
            name = f"{mod_name}.{b_name}" if mod_name else b_name
            out.setdefault(name, b.to_local() if hasattr(b, "to_local") else b)
    return out
