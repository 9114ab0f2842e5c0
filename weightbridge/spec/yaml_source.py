"""Load YAML keeping, for every JSON path, the line it came from.

Paths are JSONPath-like strings: ``$``, ``$.trainer.mesh.tp``, ``$.rollout.rules[2].shard[0]``.
Duplicate keys are reported (PyYAML silently keeps the last one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if _PLAIN_KEY.match(key) else f"{path}[{key!r}]"


@dataclass
class YamlSource:
    """Parsed YAML data plus the 1-based line of every path (its key line for mapping values)."""

    data: Any
    file: str
    lines: dict[str, int] = field(default_factory=dict)
    duplicates: list[tuple[str, int]] = field(default_factory=list)  # (path, line)

    def line_of(self, path: str) -> int | None:
        """Line of ``path`` or of its nearest ancestor that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            if cut <= 0:
                return self.lines.get("$")
            path = path[:cut]


class YamlSyntaxError(ValueError):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def load_yaml(text: str, file: str = "<spec>") -> YamlSource:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        msg = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntaxError(f"YAML syntax error: {msg}", line) from None
    src = YamlSource(data=None, file=file)
    if node is None:
        src.data = None
        src.lines["$"] = 1
        return src
    src.data = _walk(node, "$", src)
    return src


def _walk(node: yaml.Node, path: str, src: YamlSource) -> Any:
    src.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _loader().construct_object(key_node, deep=True)  # scalars only in specs
            sub = child_path(path, key if isinstance(key, (str, int)) else str(key))
            if key in out:
                src.duplicates.append((sub, key_node.start_mark.line + 1))
            src.lines[sub] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, sub, src)
            src.lines[sub] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, child_path(path, i), src) for i, item in enumerate(node.value)]
    return _loader().construct_object(node, deep=True)


_LOADER: yaml.SafeLoader | None = None


def _loader() -> yaml.SafeLoader:
    global _LOADER
    if _LOADER is None:
        _LOADER = yaml.SafeLoader("")
    return _LOADER
