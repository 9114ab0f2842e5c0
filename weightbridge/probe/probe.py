"""Probe a loader: recover a rank's layout IR from its own ``load_weights``.

:func:`probe_loader` feeds the loader index-coded canonical tensors (see
:mod:`weightbridge.probe.encode`), reads back which code each destination element
received, compresses the element map into pieces (:mod:`weightbridge.probe.compress`)
and verifies the result with one real load of random weights. Guarantees:

* **full iterator** — every ``load_weights`` call is given every canonical name, in
  model order (loaders that run collectives per name, e.g. a PP embedding broadcast,
  stay in lockstep across ranks as long as every rank probes);
* **call count** — ``rounds x chunks`` probe calls plus one verification call, where
  ``chunks = ceil(bits(#canonical elements) / code width)`` and ``rounds`` is 1 unless
  the destinations' decode state exceeds ``max_probe_bytes``; every destination dtype
  group is read in the same calls, because one code set is exactly representable in
  every dtype involved (so the number of dtype groups does not multiply the calls);
* **bounded memory** — code tensors are generated per tensor in slices of at most
  ``max_probe_bytes / 16`` elements; decode state (int64 per element) is held for
  destination row tiles of at most ``max_probe_bytes`` per round; besides that a
  backup of the destinations (their own size) is kept to restore them, and the loader
  holds one fed tensor at a time if it streams;
* **restore** — the destination values are restored in a ``finally`` (re-fetched via
  ``destinations()`` since loaders may replace tensors);
* **numerical changes are reported** — elements whose value is not a code, or that the
  verification load does not reproduce from the IR, are left out of the layout and
  listed in :attr:`ProbeResult.changed`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import torch

from weightbridge.layout.box import format_box
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, LocalTensor, Piece, RankLayout, layout_hash
from weightbridge.probe.compress import IdSpace, compress, normalize_pieces
from weightbridge.probe.encode import CodeBook, is_probe_dtype
from weightbridge.tensors import canonical_tensor, dtype_name, read_canonical, torch_dtype, write_canonical

LoadWeights = Callable[[Iterable[tuple[str, torch.Tensor]]], Any]
Destinations = Callable[[], Mapping[str, torch.Tensor]]

DEFAULT_MAX_PROBE_BYTES = 512 << 20
PROBE_FORMAT = "weightbridge.probe/v1"


class ProbeError(RuntimeError):
    """The loader could not be probed (bad destinations, inconsistent reads)."""


@dataclass(frozen=True)
class ProbeResult:
    """What probing found for one rank."""

    layout: RankLayout
    calls: int  # probe calls (rounds x chunks)
    chunks: int
    rounds: int
    code_width: int
    verify_calls: int = 0
    verified: bool = False  # a real load matched the IR on every element the IR covers
    changed: dict[str, str] = field(default_factory=dict)  # local name -> what the loader changed numerically
    casts: tuple[str, ...] = ()  # "local (float32) <- canonical (bfloat16)"
    skipped: tuple[str, ...] = ()  # destinations not probed (non-float) or left out (no element mapped)

    @property
    def ok(self) -> bool:
        return self.verified and not self.changed

    @property
    def fingerprint(self) -> str:
        """What a spec pins (``pins:``): the normalised layout's hash, independent of rank numbering."""
        from weightbridge.layout.normalize import layout_fingerprint

        return layout_fingerprint(self.layout)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROBE_FORMAT,
            "hash": layout_hash([self.layout]),
            "fingerprint": self.fingerprint,
            "layout": self.layout.to_json(),
            "calls": self.calls,
            "chunks": self.chunks,
            "rounds": self.rounds,
            "code_width": self.code_width,
            "verify_calls": self.verify_calls,
            "verified": self.verified,
            "changed": dict(self.changed),
            "casts": list(self.casts),
            "skipped": list(self.skipped),
        }

    def summary(self) -> str:
        lines = [
            f"{self.layout.side} rank {self.layout.rank}: {len(self.layout.tensors)} tensor(s), "
            f"{sum(len(t.pieces) for t in self.layout.tensors)} piece(s); {self.calls} probe call(s) "
            f"({self.rounds} round(s) x {self.chunks} chunk(s) of {self.code_width} bits), "
            f"verified: {self.verified}, hash {layout_hash([self.layout])}"
        ]
        lines += [f"  changed numerically: {k}: {v}" for k, v in self.changed.items()]
        lines += [f"  cast: {c}" for c in self.casts]
        return "\n".join(lines)


def write_probe_json(result: ProbeResult, path: str | Path) -> str:
    """Write ``result`` as JSON (with its layout hash) atomically; returns the hash."""
    obj = result.to_json()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent or "."))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return obj["hash"]


def read_probe_json(path: str | Path) -> RankLayout:
    """The layout of a probe JSON file (or of a plain ``RankLayout`` JSON); checks the hash if present."""
    obj = json.loads(Path(path).read_text())
    if "layout" not in obj:
        return RankLayout.from_json(obj)
    layout = RankLayout.from_json(obj["layout"])
    if "hash" in obj and obj["hash"] != layout_hash([layout]):
        raise ValueError(f"{path}: hash {obj['hash']} does not match its layout ({layout_hash([layout])})")
    return layout


# ---------------------------------------------------------------------------


def _float_dests(dests: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t for n, t in dests.items() if is_probe_dtype(t.dtype)}


def _zero(dests: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for t in dests.values():
            t.zero_()


def _tiles(shapes: Mapping[str, tuple[int, ...]], cap_elems: int) -> list[list[tuple[str, int, int]]]:
    """Destination row tiles (name, row start, row stop), packed into rounds of <= cap_elems elements."""
    rounds: list[list[tuple[str, int, int]]] = [[]]
    used = 0
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        row = prod(shape[1:]) if shape else 1
        if rows == 0 or row == 0:
            continue
        per = max(1, cap_elems // max(1, row))
        for a in range(0, rows, per):
            b = min(rows, a + per)
            n = (b - a) * row
            if rounds[-1] and used + n > cap_elems:
                rounds.append([])
                used = 0
            rounds[-1].append((name, a, b))
            used += n
    return [r for r in rounds if r]


def probe_loader(
    canonical: CanonicalModel,
    load_weights: LoadWeights,
    destinations: Destinations,
    *,
    side: str = "rollout",
    rank: int = 0,
    instance: int = 0,
    local_rank: int | None = None,
    coords: Mapping[str, int] | None = None,
    max_probe_bytes: int = DEFAULT_MAX_PROBE_BYTES,
    verify: bool = True,
    seed: int = 1234,
    keep_unmapped: bool = False,
    restore: bool = True,
) -> ProbeResult:
    """Recover the layout IR of one rank from its loader (see the module doc).

    ``destinations()`` must return the rank's current destination tensors by local name
    (fresh handles each call). Non-float destinations are not probed (listed in
    ``skipped``); so are destinations no canonical element lands in unless
    ``keep_unmapped``.
    """
    ids = IdSpace.of(canonical)
    total = ids.total
    first = _float_dests(destinations())
    shapes = {n: tuple(t.shape) for n, t in first.items()}
    dtypes = {n: t.dtype for n, t in first.items()}
    skipped = [f"{n} ({dtype_name(t.dtype)}: not probed)" for n, t in destinations().items() if n not in first]
    cdt = {t.name: torch_dtype(t.dtype) for t in canonical.tensors}
    book = CodeBook.for_dtypes([d for d in cdt.values() if is_probe_dtype(d)] + list(dtypes.values()))
    chunks = book.chunks(total)
    cap_elems = max(1, max_probe_bytes // 16)
    slice_elems = min(cap_elems, 1 << 20)  # cache-friendly code generation
    rounds = _tiles(shapes, cap_elems)
    backup = {n: t.detach().to('cpu', copy=True) for n, t in first.items()} if restore else {}
    del first
    calls = 0
    verify_calls = 0

    def feed(chunk: int) -> Iterator[tuple[str, torch.Tensor]]:
        shift = chunk * book.width
        mask = (1 << book.width) - 1
        for i, t in enumerate(canonical.tensors):
            dt = cdt[t.name]
            if not is_probe_dtype(dt):
                yield t.name, torch.zeros(t.shape, dtype=dt)
                continue
            n = prod(t.shape)
            out = torch.empty(n, dtype=dt)
            start = int(ids.starts[i]) + 1
            for a in range(0, n, slice_elems):
                b = min(n, a + slice_elems)
                gid = torch.arange(start + a, start + b, dtype=torch.int64)
                out[a:b] = book.encode_as((gid >> shift) & mask, dt)
            yield t.name, out.view(t.shape)

    pieces: dict[str, list[Piece]] = {n: [] for n in shapes}
    invalid: dict[str, int] = {}
    try:
        for tiles in rounds:
            acc = {tile: None for tile in tiles}
            zero0: dict = {}
            bad: dict = {}
            for c in range(chunks):
                _zero(_float_dests(destinations()))
                load_weights(feed(c))
                calls += 1
                now = destinations()
                for tile in tiles:
                    name, a, b = tile
                    t = now.get(name)
                    if t is None or tuple(t.shape) != shapes[name] or t.dtype != dtypes[name]:
                        raise ProbeError(f"destination {name} changed shape/dtype or vanished during probing")
                    region = t.detach()[a:b] if shapes[name] else t.detach().reshape(1)
                    k = book.decode_fast(region.cpu())
                    if c == 0:
                        zero0[tile] = k == -2
                        bad[tile] = k == -1
                        acc[tile] = torch.where(k >= 0, k, torch.zeros_like(k))
                    else:
                        bad[tile] |= (k == -1) | ((k == -2) != zero0[tile])
                        acc[tile] |= torch.where(k >= 0, k, torch.zeros_like(k)) << (c * book.width)
            for tile in tiles:
                name, a, b = tile
                gid = acc[tile]
                badm = bad[tile] | (~zero0[tile] & ((gid < 1) | (gid > total)))
                gmap = (gid - 1).numpy()
                gmap[zero0[tile].numpy()] = -1
                gmap[badm.numpy()] = -2
                if int(badm.sum()):
                    invalid[name] = invalid.get(name, 0) + int(badm.sum())
                if not shapes[name]:
                    got = compress(gmap.copy(), ids)
                    pieces[name] += [p._replace(local_box=()) for p in got]
                else:
                    pieces[name] += compress(gmap, ids, row_offset=a)
            del acc, zero0, bad
        norm = {n: normalize_pieces(ps) for n, ps in pieces.items()}
        changed: dict[str, str] = {
            n: f"{k} element(s) hold no probe code (changed numerically)" for n, k in invalid.items()
        }
        verified = False
        if verify:
            norm, vchanged = _verify(canonical, load_weights, destinations, norm, shapes, dtypes, ids, seed)
            verify_calls = 1
            for n, msg in vchanged.items():
                changed[n] = f"{changed[n]}; {msg}" if n in changed else msg
            verified = not vchanged
    finally:
        if restore:
            now = destinations()
            with torch.no_grad():
                for n, b in backup.items():
                    t = now.get(n)
                    if t is not None and t.shape == b.shape:
                        t.copy_(b.to(t.device))
    tensors = []
    casts = []
    for n in shapes:
        ps = norm[n]
        if not ps and not keep_unmapped:
            skipped.append(f"{n} (no canonical element lands in it)")
            continue
        tensors.append(LocalTensor(n, shapes[n], dtype_name(dtypes[n]), ps))
        for src in sorted({p.canonical for p in ps}):
            if cdt[src] != dtypes[n]:
                casts.append(f"{n} ({dtype_name(dtypes[n])}) <- {src} ({dtype_name(cdt[src])})")
    layout = RankLayout(
        side=side,
        rank=rank,
        tensors=tuple(tensors),
        instance=instance,
        local_rank=rank if local_rank is None else local_rank,
        coords=tuple(sorted((coords or {}).items())),
    )
    return ProbeResult(
        layout=layout,
        calls=calls,
        chunks=chunks,
        rounds=len(rounds),
        code_width=book.width,
        verify_calls=verify_calls,
        verified=verified,
        changed=changed,
        casts=tuple(casts),
        skipped=tuple(skipped),
    )


def _verify(
    canonical: CanonicalModel,
    load_weights: LoadWeights,
    destinations: Destinations,
    norm: dict[str, tuple[Piece, ...]],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, torch.dtype],
    ids: IdSpace,
    seed: int,
) -> tuple[dict[str, tuple[Piece, ...]], dict[str, str]]:
    """One real load of random weights vs the IR replayed onto zeros; mismatching elements are
    dropped from the pieces and reported."""
    by_src: dict[str, list[tuple[str, Piece]]] = {}
    for n, ps in norm.items():
        for p in ps:
            by_src.setdefault(p.canonical, []).append((n, p))
    want = {n: torch.zeros(shapes[n], dtype=dtypes[n]) for n in shapes}

    def real() -> Iterator[tuple[str, torch.Tensor]]:
        for t in canonical.tensors:
            x = canonical_tensor(t, seed=seed)
            for n, p in by_src.get(t.name, ()):
                vals = read_canonical(x, p.canonical_box, False, tuple(b - a for a, b in p.canonical_box))
                write_canonical(want[n], p.local_box, p.transpose, vals)
            yield t.name, x

    _zero(_float_dests(destinations()))
    load_weights(real())
    now = destinations()
    changed: dict[str, str] = {}
    out = dict(norm)
    for n in shapes:
        got = now[n].detach().cpu()
        w = want[n]
        size = got.element_size()
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
        diff = got.contiguous().view(view) != w.view(view)
        cnt = int(diff.sum())
        if not cnt:
            continue
        where = np.argwhere(diff.numpy()) if diff.dim() else np.zeros((1, 0), dtype=np.int64)
        lo, hi = where.min(axis=0), where.max(axis=0) + 1
        bbox = tuple((int(a), int(b)) for a, b in zip(lo, hi))
        srcs = sorted({p.canonical for p in norm[n]})
        changed[n] = (
            f"{cnt} of {got.numel()} element(s) differ from the IR replay in the real load, "
            f"within {format_box(bbox)} (sources decoded there: {', '.join(srcs) or 'none'}); left out of the layout"
        )
        # A piece is one copy: if any of its elements is not reproduced, none of it is trusted
        # (bf16 values of a changed element can equal the replayed value by chance).
        dmask = diff.numpy().reshape(shapes[n] or (1,))
        keep = []
        dropped = 0
        for p in norm[n]:
            box = tuple(slice(a, b) for a, b in p.local_box) if shapes[n] else (slice(0, 1),)
            if dmask[box].any():
                dropped += 1
            else:
                keep.append(p)
        changed[n] += f" ({dropped} piece(s) dropped)"
        out[n] = tuple(keep)
    return out, changed


def canonical_from_tensors(tensors: Mapping[str, torch.Tensor]) -> CanonicalModel:
    """A :class:`CanonicalModel` of named full tensors (e.g. a HF ``state_dict``), in the given order."""
    return CanonicalModel(tuple(CanonicalTensor(n, tuple(t.shape), dtype_name(t.dtype)) for n, t in tensors.items()))
