"""Server configuration and the path rules: where tools may read and write files and run tests.

Every path argument is resolved against ``base_dir`` (the server's working directory
unless configured), symlinks resolved, and must lie inside one of the configured ``roots``:
reading a spec or a model, writing a file and running a test module alike. The worker
processes that run the tools (:mod:`mcp_server.worker`) also refuse to open any file
outside the roots that a spec points to (a model path, a checkpoint shard).

Error messages echo argument values and file content only as short excerpts
(:func:`excerpt`, :func:`clip`): a prompt-injected agent cannot use them to read files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mcp.server.mcpserver.exceptions import ToolError


STATE_DIR_NAME = ".weightbridge-mcp"  # in the first root, unless --state-dir says otherwise
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX: one path component
EXCERPT_CHARS = 80  # an argument value quoted in an error
LINE_CHARS = 300  # one line of an error message
MESSAGE_CHARS = 4000  # a whole error message
MESSAGE_LINES = 25


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)``, shortened to about ``limit`` characters with its length when it is longer."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    head = repr(text[:limit]) if isinstance(value, str) else text[:limit]
    return f"{head}... ({len(text)} chars)"


def clip(text: str, *, line_chars: int = LINE_CHARS, max_lines: int = MESSAGE_LINES, total: int = MESSAGE_CHARS) -> str:
    """``text`` bounded: each line at most ``line_chars``, at most ``max_lines`` lines and ``total`` characters."""
    lines = text.splitlines() or [""]
    out = [ln if len(ln) <= line_chars else ln[:line_chars] + f"... ({len(ln) - line_chars} more chars)" for ln in lines[:max_lines]]
    if len(lines) > max_lines:
        out.append(f"... ({len(lines) - max_lines} more lines)")
    joined = "\n".join(out)
    return joined if len(joined) <= total else joined[:total] + "... (truncated)"


def short_path(path: object, limit: int = 200) -> str:
    """A path for a message: whole when short, else its start and end around '...'."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 2 + 10:]} ({len(text)} chars)"


def fail(argument: str, message: str) -> ToolError:
    """The error for a bad tool argument: the message starts with the argument's name (or JSON path)."""
    return ToolError(clip(f"{argument}: {message}"))


def check_path_text(raw: object, argument: str) -> str:
    """``raw`` when it can be a path (a non-empty string, no NUL, not longer than the OS allows), else a ToolError."""
    if not isinstance(raw, str) or not raw:
        raise fail(argument, "expected a file path")
    if "\x00" in raw:
        raise fail(argument, f"{excerpt(raw)} contains a NUL byte; expected a file path")
    if len(raw) > MAX_PATH_CHARS:
        raise fail(argument, f"path of {len(raw)} characters is too long (at most {MAX_PATH_CHARS})")
    longest = max(raw.split("/"), key=lambda part: len(part.encode(errors="surrogateescape")))
    if len(longest.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        raise fail(argument, f"a path component is longer than {MAX_NAME_BYTES} bytes: {excerpt(longest, 40)}")
    return raw


@dataclass(frozen=True)
class ServerConfig:
    """What a server instance may do.

    ``roots``: directories where tools may write files and run tests (default: ``base_dir``).
    ``read_only``: hide the tools that write files or run code (``probe_layout``,
    ``run_conformance``) and drop ``generate_spec``'s ``write_to``.
    ``max_timeout_s``: upper bound of any ``timeout_s`` argument (declared as its schema's maximum).
    ``call_timeout_s``: wall-clock limit of one tool call's worker process (it is killed after it).
    ``worker_memory_mb``: address-space limit of a worker process.
    ``state_dir``: where the server writes its own files (temporary files, caches; :mod:`mcp_server.scratch`);
    inside the roots, default ``ROOT/.weightbridge-mcp`` of the first root.
    """

    base_dir: Path = field(default_factory=Path.cwd)
    roots: tuple[Path, ...] = ()
    read_only: bool = False
    max_timeout_s: int = 1800
    call_timeout_s: float = 120.0
    worker_memory_mb: int = 4096
    state_dir: Path | None = None

    def __post_init__(self) -> None:
        base = Path(self.base_dir).expanduser().resolve()
        object.__setattr__(self, "base_dir", base)
        roots = tuple(Path(r).expanduser().resolve() for r in self.roots) or (base,)
        object.__setattr__(self, "roots", roots)
        object.__setattr__(self, "call_timeout_s", float(self.call_timeout_s))
        state = Path(self.state_dir).expanduser() if self.state_dir is not None else roots[0] / STATE_DIR_NAME
        state = (state if state.is_absolute() else base / state).resolve()
        if not self.is_inside(state):
            raise ValueError(f"the state directory {state} is outside the allowed roots ({', '.join(map(str, roots))})")
        object.__setattr__(self, "state_dir", state)

    def to_json(self) -> dict[str, object]:
        """The fields as JSON (a worker process rebuilds the config with ``ServerConfig(**obj)``)."""
        return {"base_dir": str(self.base_dir), "roots": [str(r) for r in self.roots], "read_only": self.read_only,
                "max_timeout_s": self.max_timeout_s, "call_timeout_s": self.call_timeout_s,
                "worker_memory_mb": self.worker_memory_mb, "state_dir": str(self.state_dir)}

    def resolve(self, raw: str) -> Path:
        """``raw`` as an absolute path (``~`` expanded, relative to ``base_dir``), symlinks resolved."""
        path = Path(os.path.expanduser(raw))
        try:
            return (path if path.is_absolute() else self.base_dir / path).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name the OS refuses
            raise fail("path", f"{excerpt(raw)} cannot be resolved ({type(exc).__name__})") from None

    def is_inside(self, path: Path) -> bool:
        """``path`` (resolved) lies in one of the roots."""
        return any(path == r or path.is_relative_to(r) for r in self.roots)

    def inside_roots(self, raw: str, argument: str) -> Path:
        """The resolved path, or a ToolError naming ``argument`` when it lies outside every root."""
        check_path_text(raw, argument)
        try:
            path = self.resolve(raw)
        except ToolError:
            raise fail(argument, f"{excerpt(raw)} cannot be resolved (a symlink loop?)") from None
        if not self.is_inside(path):
            allowed = ", ".join(str(r) for r in self.roots)
            raise fail(argument, f"{short_path(path)} is outside the allowed roots ({allowed}); start the server with --root DIR to allow another")
        return path

    def readable(self, raw: str, argument: str, *, directory_ok: bool = False, max_bytes: int | None = None) -> Path:
        """An existing file (or, with ``directory_ok``, a directory) inside the roots; a ToolError naming ``argument`` otherwise."""
        path = self.inside_roots(raw, argument)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise fail(argument, f"{short_path(path)}: no such file") from None
        except OSError as exc:
            raise fail(argument, f"{short_path(path)}: cannot read ({exc.strerror or type(exc).__name__})") from None
        if stat.S_ISDIR(st.st_mode):
            if directory_ok:
                return path
            raise fail(argument, f"{short_path(path)}: is a directory; give a file")
        if not stat.S_ISREG(st.st_mode):
            raise fail(argument, f"{short_path(path)}: not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise fail(argument, f"{short_path(path)}: {st.st_size} bytes is too large (at most {max_bytes})")
        return path

    def writable(self, raw: str, argument: str, *, overwrite: bool) -> Path:
        """A path inside the roots whose parent directory exists; refuses to replace a file unless ``overwrite``."""
        path = self.inside_roots(raw, argument)
        if path.is_dir():
            raise fail(argument, f"{path} is a directory; give a file name")
        if not path.parent.is_dir():
            raise fail(argument, f"directory {path.parent} does not exist")
        if path.exists() and not overwrite:
            raise fail(argument, f"{path} exists; pass overwrite=true to replace it")
        return path


def write_text_atomic(path: Path, text: str, argument: str = "output") -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory (never a torn file).

    An OS error (no permission, a full disk) is a ToolError naming ``argument``.
    """
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise fail(argument, f"cannot write {short_path(path)}: {exc.strerror or type(exc).__name__}") from None
    finally:
        tmp.unlink(missing_ok=True)
