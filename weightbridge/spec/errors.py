"""User-facing spec errors: ``file:line: $.json.path: message (hint)``.

Every user value a message echoes is bounded (:func:`excerpt`): a 5 MB glob or key comes back
as its first ~200 characters plus ``... (N chars)``, never whole. :class:`SpecProblem` bounds
its own fields as a last resort, so no caller can print an unbounded problem.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ECHO = 200  # characters of one echoed user value
_MAX_FIELD = {"path": 400, "file": 240, "message": 2000, "hint": 1000}


def excerpt(value: object, limit: int = MAX_ECHO) -> str:
    """``str(value)``, or its first ``limit`` characters plus ``... (N chars)`` when longer."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def show(value: object, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` bounded like :func:`excerpt` (a long string is cut before it is repr'd)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 20:
        return f"{type(value).__name__} of {len(value)} items"
    try:
        return excerpt(repr(value), limit)
    except RecursionError:  # a self-referencing or very deep value
        return f"<{type(value).__name__}>"


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec, located by JSON path (``$.rollout.mesh.tp``) and line."""

    path: str
    message: str
    hint: str = ""
    file: str = "<spec>"
    line: int | None = None

    def __post_init__(self) -> None:
        for name, limit in _MAX_FIELD.items():
            value = getattr(self, name)
            if isinstance(value, str) and len(value) > limit:
                object.__setattr__(self, name, excerpt(value, limit))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}: {self.path}: {self.message}{hint}"

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "path": self.path, "message": self.message, "hint": self.hint}


class SpecErrors(Exception):
    """Every problem found in a spec; ``str()`` prints one per line. CLI exit code 2."""

    exit_code = 2

    def __init__(self, problems: list[SpecProblem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in spec")
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
