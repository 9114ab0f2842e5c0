"""Server configuration and the path rules: where tools may write files and run tests.

Every path argument is resolved against ``base_dir`` (the server's working directory
unless configured). Reading a spec or a model works anywhere (like the CLI); writing a
file, or running a test module, only inside one of the configured ``roots``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mcp.server.mcpserver.exceptions import ToolError


def fail(argument: str, message: str) -> ToolError:
    """The error for a bad tool argument: the message starts with the argument's name (or JSON path)."""
    return ToolError(f"{argument}: {message}")


@dataclass(frozen=True)
class ServerConfig:
    """What a server instance may do.

    ``roots``: directories where tools may write files and run tests (default: ``base_dir``).
    ``read_only``: hide the tools that write files or run code (``probe_layout``,
    ``run_conformance``) and drop ``generate_spec``'s ``write_to``.
    ``max_timeout_s``: upper bound of any ``timeout_s`` argument.
    """

    base_dir: Path = field(default_factory=Path.cwd)
    roots: tuple[Path, ...] = ()
    read_only: bool = False
    max_timeout_s: int = 1800

    def __post_init__(self) -> None:
        base = Path(self.base_dir).expanduser().resolve()
        object.__setattr__(self, "base_dir", base)
        roots = tuple(Path(r).expanduser().resolve() for r in self.roots) or (base,)
        object.__setattr__(self, "roots", roots)

    def resolve(self, raw: str) -> Path:
        """``raw`` as an absolute path (``~`` expanded, relative to ``base_dir``), symlinks resolved."""
        path = Path(os.path.expanduser(raw))
        return (path if path.is_absolute() else self.base_dir / path).resolve()

    def inside_roots(self, raw: str, argument: str) -> Path:
        """The resolved path, or a ToolError naming ``argument`` when it lies outside every root."""
        if not raw or "\x00" in raw:
            raise fail(argument, "expected a file path")
        path = self.resolve(raw)
        if not any(path == r or path.is_relative_to(r) for r in self.roots):
            allowed = ", ".join(str(r) for r in self.roots)
            raise fail(argument, f"{path} is outside the allowed roots ({allowed}); start the server with --root DIR to allow another")
        return path

    def check_timeout(self, timeout_s: int) -> None:
        """A ToolError naming ``timeout_s`` when it exceeds ``max_timeout_s``."""
        if timeout_s > self.max_timeout_s:
            raise fail("timeout_s", f"{timeout_s} exceeds this server's limit of {self.max_timeout_s} s")

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


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory (never a torn file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
