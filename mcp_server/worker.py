"""Run a tool's work in a killable worker process, with a deadline, confined to the roots.

Resolving a spec, planning, explaining and inspecting a model can take long (a huge model, a
pathological but valid spec) and read files a spec points to. None of it runs in the server
process: :func:`call` hands the work to a fresh worker process, waits for its result without
blocking the event loop, and kills the worker (SIGKILL to its process group) when the call's
limit (``ServerConfig.call_timeout_s``) passes or the client cancels the request, so the CPU
use stops with the call.

Workers are forked from a *zygote*: one long-lived ``python -m mcp_server.worker`` child of the
server that has imported weightbridge once, so a call costs a fork (milliseconds), not an
interpreter start. The zygote reads one job directory per line on stdin, forks, answers the
worker's pid, reaps it and writes ``exit`` into the job directory. It exits when its stdin
closes (the server exited); a worker dies with the zygote (``PR_SET_PDEATHSIG``) and has its
own session, address-space limit (``worker_memory_mb``) and CPU-time limit.

In the worker an audit hook refuses to open (or list) any path outside the roots, except what
the interpreter itself needs (its installation, the weightbridge packages, /dev, /proc and /sys
but no ``environ``): a spec inside a root cannot point a model path or a checkpoint shard at a
file outside. Its job directory (its ``TMPDIR``) and its caches lie inside the roots
(:mod:`mcp_server.scratch`).
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from mcp_server import scratch
from mcp_server.roots import ServerConfig, clip, fail

T = TypeVar("T")
KILL_WAIT_S = 3.0
PRELOAD = (
    "mcp_server.specs", "mcp_server.tools_model", "mcp_server.tools_plan", "mcp_server.tools_spec",
    "mcp_server.tools_probe", "weightbridge.spec.resolve", "weightbridge.ops.planning", "weightbridge.layout.explain",
    "weightbridge.canonical.describe", "weightbridge.ops.draft", "weightbridge.probe.diff",
)


# ---- server side ------------------------------------------------------------------------------------------


class _Zygote:
    """The server's zygote process: started on first use, restarted when it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        here = Path(__file__).resolve().parent.parent  # holds mcp_server: no directory of the user shadows it
        return subprocess.Popen([sys.executable, "-m", "mcp_server.worker"], cwd=here, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, start_new_session=True)

    def start(self) -> None:
        """Start the zygote now (it imports in the background) unless it runs."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()

    def fork(self, job_dir: Path) -> int:
        """Start a worker on ``job_dir`` (blocking: run it in a thread); its pid."""
        with self._lock:
            for attempt in (1, 2):
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                assert self._proc.stdin is not None and self._proc.stdout is not None
                try:
                    self._proc.stdin.write(json.dumps({"dir": str(job_dir)}).encode() + b"\n")
                    self._proc.stdin.flush()
                    line = self._proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = b""
                if line:
                    return int(json.loads(line)["pid"])
                self._proc.kill()  # it died (or was killed): start another once
                self._proc.wait()
                self._proc = None
        raise RuntimeError("the worker zygote does not start; see the server's stderr")

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


ZYGOTE = _Zygote()


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def call(config: ServerConfig, fn: Callable[..., Any], result_type: type[T], *, argument: str,
               **kwargs: Any) -> T:
    """``fn(ServerConfig, **kwargs)`` in a worker process; its result validated as ``result_type``.

    ``fn`` is a module-level function returning a pydantic model (or JSON); a ToolError it raises
    comes back as a ToolError with the same (bounded) message. Anything else it raises is reported
    as a ToolError naming ``argument`` (the input it was working on) with the exception type only.
    The worker is killed after ``config.call_timeout_s`` or when the awaiting task is cancelled.
    """
    job = Path(tempfile.mkdtemp(prefix="wb-mcp-job-", dir=scratch.tmp_root(config)))  # inside the roots
    try:
        request = {"target": f"{fn.__module__}:{fn.__qualname__}", "config": config.to_json(), "argument": argument,
                   "kwargs": kwargs}
        (job / "request.json").write_text(json.dumps(request))
        with anyio.CancelScope(shield=True):  # once forked, the worker must be known to be killed
            pid = await anyio.to_thread.run_sync(ZYGOTE.fork, job)
        start = time.monotonic()
        result, exited = job / "result.json", job / "exit"
        try:
            delay = 0.005
            while not result.exists() and not exited.exists():
                if time.monotonic() - start > config.call_timeout_s:
                    raise fail("call_timeout", f"the call did not finish within {config.call_timeout_s:g} s (the "
                               "server's --call-timeout); its worker process was killed")
                await anyio.sleep(delay)
                delay = min(delay * 1.5, 0.1)
        finally:
            if not exited.exists():
                _kill(pid)
                with anyio.CancelScope(shield=True):
                    deadline = time.monotonic() + KILL_WAIT_S
                    while not exited.exists() and time.monotonic() < deadline:
                        await anyio.sleep(0.01)
        if not result.exists():
            status = exited.read_text().strip() if exited.exists() else "?"
            raise fail(argument, f"the worker process stopped without a result (wait status {status}; out of memory "
                       f"beyond {config.worker_memory_mb} MiB?)")
        out = json.loads(result.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(job, ignore_errors=True)
    if "error" in out:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(clip(out["error"]))
    return result_type.model_validate(out["ok"]) if hasattr(result_type, "model_validate") else out["ok"]  # type: ignore[attr-defined]


# ---- worker side ------------------------------------------------------------------------------------------


def _allowed_dirs(config: ServerConfig, job: Path) -> tuple[list[str], list[str]]:
    """(directories whose files a worker may read, system prefixes it may read except ``environ``)."""
    import site

    import weightbridge

    dirs = {str(r) for r in config.roots} | {str(job)}
    dirs |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    try:
        dirs |= {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    except AttributeError:  # pragma: no cover - a virtualenv's old site module
        pass
    dirs |= {os.path.realpath(os.path.dirname(weightbridge.__file__)), os.path.realpath(os.path.dirname(__file__))}
    return sorted(dirs), ["/dev", "/proc", "/sys"]


def _guard(config: ServerConfig, job: Path) -> None:
    """Refuse every open / listdir outside the allowed directories, from now on in this process."""
    dirs, system = _allowed_dirs(config, job)

    def inside(real: str, prefixes: list[str]) -> bool:
        return any(real == p or real.startswith(p.rstrip("/") + "/") for p in prefixes)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in ("open", "os.listdir", "os.scandir"):
            return
        target = args[0] if args else None
        if target is None or isinstance(target, int):
            return
        real = os.path.realpath(os.fsdecode(target) or ".")
        if inside(real, dirs) or (inside(real, system) and not real.endswith("/environ")):
            return
        raise PermissionError(errno.EACCES, "outside the allowed roots of this MCP server", real)

    sys.addaudithook(hook)


def _limits(config: ServerConfig) -> None:
    import resource

    mem = config.worker_memory_mb * (1 << 20)
    cpu = int(config.call_timeout_s) + 10
    for kind, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu)):
        try:
            _, hard = resource.getrlimit(kind)
            resource.setrlimit(kind, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))
        except (ValueError, OSError):  # pragma: no cover - a platform without the limit
            pass


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _error(argument: str, exc: BaseException, config: ServerConfig) -> str:
    """The bounded reason for an unexpected exception (its traceback goes to stderr, the server's log)."""
    if isinstance(exc, MemoryError):
        return f"{argument}: needs more than the worker's {config.worker_memory_mb} MiB of memory"
    if isinstance(exc, RecursionError):
        return f"{argument}: nested too deeply to process"
    if isinstance(exc, UnicodeError):
        return f"{argument}: not valid UTF-8 text ({type(exc).__name__})"
    if isinstance(exc, PermissionError) and "allowed roots" in str(exc):
        return f"{argument}: reads a file outside the allowed roots ({clip(str(exc.filename), max_lines=1)})"
    traceback.print_exception(exc, file=sys.stderr)
    return f"{argument}: could not be processed ({type(exc).__name__}); the server's log has the details"


def run_job(job: Path) -> dict[str, Any]:
    """Run the request in ``job`` (in this process) and return its result object."""
    from mcp.server.mcpserver.exceptions import ToolError

    request = json.loads((job / "request.json").read_text())
    config = ServerConfig(**request["config"])
    argument = request["argument"]
    try:
        module, name = request["target"].split(":")
        fn = getattr(importlib.import_module(module), name)
        os.chdir(config.base_dir)
        os.environ["TMPDIR"] = tempfile.tempdir = str(job)
        # Caches inside the roots too (the canonical model cache reads WEIGHTBRIDGE_CACHE_DIR at each load).
        os.environ.update({k: v for k, v in scratch.child_env(config, job).items()
                           if k in (scratch.CACHE_ENV, "XDG_CACHE_HOME")})
        _limits(config)
        _guard(config, job)
        out = fn(config, **request["kwargs"])
        return {"ok": out.model_dump(mode="json") if hasattr(out, "model_dump") else out}
    except ToolError as exc:
        return {"error": clip(str(exc))}
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a bounded reason
        return {"error": _error(argument, exc, config)}


def _child(job: Path) -> None:
    """In the forked worker: own session, die with the zygote, run the job, write its result, exit."""
    code = 0
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        _die_with_parent()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(2, 1)  # stdout is the zygote's pipe to the server
        out = run_job(job)
        tmp = job / "result.tmp"
        tmp.write_text(json.dumps(out), encoding="utf-8")
        os.replace(tmp, job / "result.json")
    except BaseException:  # noqa: BLE001 - the parent reports "stopped without a result"
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def zygote_main() -> None:
    """Preload, then fork one worker per job directory read from stdin; exit at end of input."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PRELOAD:
        importlib.import_module(name)
    jobs: dict[int, Path] = {}

    def reap(signum: int, frame: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = jobs.pop(pid, None)
            if job is not None:
                try:
                    (job / "exit").write_text(str(status))
                except OSError:
                    pass

    signal.signal(signal.SIGCHLD, reap)
    out = sys.stdout.buffer
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        job = Path(json.loads(line)["dir"])
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # register the pid before it can be reaped
        try:
            pid = os.fork()
            if pid == 0:
                _child(job)
            jobs[pid] = job
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        out.write(json.dumps({"pid": pid}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    zygote_main()
