"""Launch local processes with a hard wall-clock deadline (the demo, the conformance suite, tests, bench).

Product code (the demo) uses it, so it is here and not in the test package; the conformance suite
re-exports :func:`launch` as ``weightbridge.testing.launch``.

:func:`launch` runs one function per rank in fresh local processes: processes still running at
the deadline are killed and reported, so nothing hangs. Tensors for such runs (canonical values,
a rank's materialised local tensors, bitwise comparison) are in :mod:`weightbridge.tensors`.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


_PRELOAD = ["torch", "torch.distributed", "weightbridge.tensors", "weightbridge.transport.executor", "weightbridge.spec.resolve", "weightbridge.plan"]
_served: frozenset[str] | None = None  # what the fork server this module started imports (None: none started)
_in_flight = 0  # launches running now (a fork server is restarted only when none is)
_lock = threading.Lock()  # launches may come from several threads (the vLLM selfcheck's trainers)


def _forkserver(preload: Sequence[str]) -> Any:
    """The forkserver context, its server importing ``_PRELOAD``, ``preload`` and what it imported before.

    Python starts one fork server per process and fixes its preload list at the first start, so a
    later launch's ``preload`` would be ignored: a session that first ran a plain test then imported
    vLLM or Megatron-Core in every rank of every later launch (~5-15 s each). A server this module
    started is restarted with the union when a launch asks for more and no launch is in flight (its
    children are independent processes; one started elsewhere is left alone)."""
    global _served
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    want = frozenset([*_PRELOAD, *preload, *(_served or ())])
    server = getattr(forkserver, "_forkserver", None)
    running = getattr(server, "_forkserver_pid", None) is not None
    if running and (_served is None or want <= _served or _in_flight or not hasattr(server, "_stop")):
        return ctx
    if running:
        server._stop()
    ctx.set_forkserver_preload(sorted(want))
    _served = want
    return ctx


def ensure_env_secret() -> str:
    """The launcher's job secret: ``$WEIGHTBRIDGE_SECRET``, set here to a fresh random one when unset, so
    that every process it starts (and every engine worker they start) inherits the same one. Harnesses
    that start processes call it first; the library itself never writes the environment."""
    from weightbridge.sync.auth import ENV, new_secret

    value = os.environ.get(ENV)
    if not value:
        value = os.environ[ENV] = new_secret()
    return value


def _child(fn: Callable, args: tuple, conn: Any, threads: int, secret: str = "") -> None:
    if secret:  # the launcher's job secret (a forkserver started earlier does not have the launcher's env)
        from weightbridge.sync.auth import ENV

        os.environ[ENV] = secret
    if threads:
        import torch

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

    Every process gets the launcher's job secret (``$WEIGHTBRIDGE_SECRET``, set here to a fresh
    random one when unset, so bridges built in the children authenticate each other).
    """
    global _in_flight
    secret = ensure_env_secret()
    with _lock:
        ctx = _forkserver(preload) if start_method == "forkserver" else mp.get_context(start_method)
        _in_flight += 1
    try:
        return _run(ctx, fn, args_per_process, timeout_s, threads, secret)
    finally:
        with _lock:
            _in_flight -= 1


def _run(ctx: Any, fn: Callable, args_per_process: Sequence[tuple], timeout_s: float, threads: int,
         secret: str) -> list[RankResult]:
    procs, conns = [], []
    for args in args_per_process:
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, tuple(args), w, threads, secret), daemon=True)
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
