"""Helpers for tests, benchmarks and demos of the data plane (no torch.distributed here).

* :func:`canonical_tensor` / :func:`canonical_tensors` — deterministic full canonical tensors
  (same values in every process for the same seed), the "trainer's canonical weights";
* :func:`materialize` — a rank's local tensors built from canonical tensors through its IR
  pieces (what the rank must hold; uncovered elements, e.g. padded vocabulary rows, = ``fill``);
* :func:`bitwise_equal` / :func:`diff_tensors` — exact comparison (NaN- and -0-safe);
* :func:`launch` — run one function per rank in fresh local processes with a hard wall-clock
  deadline: processes still running at the deadline are killed and reported, so nothing hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from weightbridge.layout.box import box_shape
from weightbridge.layout.ir import CanonicalModel, CanonicalTensor, RankLayout
from weightbridge.transport.pack import read_canonical, torch_dtype, write_canonical

# ---------------------------------------------------------------------------
# tensors
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


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


@dataclass
class RankResult:
    """Outcome of one launched process."""

    index: int
    ok: bool
    value: Any = None  # the function's return value (picklable) when ok
    error: BaseException | None = None  # the exception it raised (re-created here) when not ok
    traceback: str = ""
    exitcode: int | None = None
    timed_out: bool = False  # killed at the deadline

    def unwrap(self) -> Any:
        if self.ok:
            return self.value
        if self.error is not None:
            raise RuntimeError(f"process {self.index} failed:\n{self.traceback}") from self.error
        raise RuntimeError(f"process {self.index} died (exit code {self.exitcode}, timed out: {self.timed_out})")


_PRELOAD = ["torch", "torch.distributed", "weightbridge.transport", "weightbridge.spec.resolve", "weightbridge.plan"]


def _child(fn: Callable, args: tuple, conn: Any, threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
    try:
        value = fn(*args)
        msg: tuple = ("ok", value)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        tb = traceback.format_exc()
        try:
            import pickle

            pickle.dumps(exc)
            msg = ("error", exc, tb)
        except Exception:  # noqa: BLE001
            msg = ("error", RuntimeError(f"{type(exc).__name__}: {exc}"), tb)
    try:
        conn.send(msg)
        conn.close()
    finally:
        os._exit(0)  # skip interpreter teardown (atexit hooks, backend destructors)


def launch(
    fn: Callable,
    args_per_process: Sequence[tuple],
    *,
    timeout_s: float,
    start_method: str = "forkserver",
    threads: int = 1,
    preload: Sequence[str] = (),
) -> list[RankResult]:
    """Run ``fn(*args)`` for each entry of ``args_per_process``, each in a fresh process.

    ``fn`` must be importable (module-level). Returns one :class:`RankResult` per process, in
    order. No process outlives ``timeout_s``: any still running then is killed (SIGKILL) and
    reported with ``timed_out=True``. ``forkserver`` (default) starts processes from a server
    that has already imported torch and weightbridge (plus ``preload`` modules), so a start
    costs milliseconds.
    """
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload([*_PRELOAD, *preload])
    procs, conns = [], []
    for args in args_per_process:
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, tuple(args), w, threads), daemon=True)
        p.start()
        w.close()
        procs.append(p)
        conns.append(r)
    results: dict[int, RankResult] = {}
    deadline = time.monotonic() + timeout_s
    waiting = {i: c for i, c in enumerate(conns)}
    while waiting and time.monotonic() < deadline:
        ready = mpc.wait(list(waiting.values()), timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        for c in ready:
            i = next(k for k, v in waiting.items() if v is c)
            try:
                msg = c.recv()
            except (EOFError, OSError):
                procs[i].join(5)
                results[i] = RankResult(i, False, exitcode=procs[i].exitcode)
            else:
                if msg[0] == "ok":
                    results[i] = RankResult(i, True, value=msg[1])
                else:
                    results[i] = RankResult(i, False, error=msg[1], traceback=msg[2])
            del waiting[i]
    for i, p in enumerate(procs):
        if i in waiting:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            results[i] = RankResult(i, False, timed_out=True)
        p.join(5)
        if p.is_alive():  # pragma: no cover - SIGKILL did not take
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)
        results[i].exitcode = p.exitcode
    for c in conns:
        c.close()
    return [results[i] for i in range(len(procs))]
