"""User-facing spec errors: ``file:line: $.json.path: message (hint)``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec, located by JSON path (``$.rollout.mesh.tp``) and line."""

    path: str
    message: str
    hint: str = ""
    file: str = "<spec>"
    line: int | None = None

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
