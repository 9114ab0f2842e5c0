"""Run a command in its own process group with a deadline; never leave a process behind.

The command starts a new session (``start_new_session=True``), so it and everything it
spawns share one process group. When the deadline passes, or the awaiting task is
cancelled (the client cancelled the request), the whole group gets SIGTERM, then SIGKILL
after a grace period. After a normal exit the group is killed too, so a test that started
a background process cannot leave it running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

POLL_S = 0.2
GRACE_S = 3.0


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None when killed at the deadline
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


def kill_group(pgid: int, proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for the leader, then SIGKILL the group; reap the leader."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass


def _spawn(argv: Sequence[str], cwd: Path, env: dict[str, str] | None, out: Path, err: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session, stdout/stderr to files (a full pipe cannot block it)."""
    with open(out, "wb") as fout, open(err, "wb") as ferr:
        return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr,
                                start_new_session=True)


def _tail(path: Path, limit: int) -> str:
    data = path.read_bytes()
    return data[-limit:].decode(errors="replace")


async def run_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    timeout_s: float,
    scratch: Path,
    env: dict[str, str] | None = None,
    on_tick: Callable[[float], Awaitable[None]] | None = None,
    output_limit: int = 64_000,
) -> Finished:
    """Run ``argv`` to completion or ``timeout_s``; ``on_tick(elapsed)`` is awaited about every 0.2 s.
    Its stdout and stderr go to files in ``scratch`` (the call's directory, inside the roots)."""
    with tempfile.TemporaryDirectory(prefix="wb-mcp-", dir=scratch) as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        start = time.monotonic()
        proc = await anyio.to_thread.run_sync(_spawn, argv, cwd, env, out_path, err_path)
        timed_out = False
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - start
                if elapsed >= timeout_s:
                    timed_out = True
                    break
                if on_tick is not None:
                    await on_tick(elapsed)
                await anyio.sleep(POLL_S)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(kill_group, proc.pid, proc)
        return Finished(
            returncode=None if timed_out else proc.returncode,
            stdout=_tail(out_path, output_limit),
            stderr=_tail(err_path, output_limit),
            seconds=time.monotonic() - start,
            timed_out=timed_out,
        )
