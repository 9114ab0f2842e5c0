"""Load YAML keeping, for every JSON path, the line it came from.

Paths are JSONPath-like strings: ``$``, ``$.trainer.mesh.tp``, ``$.rollout.rules[2].shard[0]``.
Duplicate keys are reported (PyYAML silently keeps the last one).

Hostile input is bounded before anything is built: the text is at most :data:`MAX_TEXT_CHARS`,
nesting at most :data:`MAX_DEPTH` levels, and the document at most :data:`MAX_NODES` nodes
*after* alias expansion (an 800-byte "billion laughs" of nested ``*aliases`` is refused at the
alias that crosses the limit, in time and memory linear in the text). A self-referencing alias,
a non-scalar mapping key and a scalar PyYAML cannot construct (``2001-13-45``, a 5,000-digit
integer) are YAML errors with a line, never exceptions of another type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from weightbridge.spec.errors import excerpt, show

MAX_TEXT_CHARS = 4 * 1024 * 1024  # a spec is a few KiB; inline tensor lists stay far below this
MAX_DEPTH = 64  # a spec needs ~6 levels ($.rollout.rules[0].shard[0].axis)
MAX_NODES = 500_000  # YAML nodes after alias expansion

# libyaml's parser and composer when PyYAML has them (10x faster); the pure-Python ones otherwise.
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def child_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}"
    return f"{path}[{show(key)}]"


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
    """The text is not YAML a spec can be read from; ``line`` (1-based) and ``hint`` say where and what to do."""

    def __init__(self, message: str, line: int | None, hint: str = "fix the YAML syntax") -> None:
        super().__init__(message)
        self.line = line
        self.hint = hint


def load_yaml(text: str, file: str = "<spec>") -> YamlSource:
    if len(text) > MAX_TEXT_CHARS:
        raise YamlSyntaxError(
            f"spec is {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} a spec may have", None,
            "a spec is a few KiB: name the model (bundled / config / safetensors) instead of listing its tensors",
        )
    try:
        _check_bounds(text)
        node = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.reader.ReaderError as exc:  # a character YAML forbids: it has a position, not a mark
        raise _forbidden_character(text, exc) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        msg = getattr(exc, "problem", None) or str(exc)
        if "maximum nesting depth" in msg:  # libyaml >= 0.2.5 (PyYAML 6.0.4 wheels) scans ahead of our bound
            raise YamlSyntaxError(f"nesting deeper than {MAX_DEPTH} levels", line, _DEEP_HINT) from None
        raise YamlSyntaxError(f"YAML syntax error: {excerpt(' '.join(str(msg).split()))}", line) from None
    src = YamlSource(data=None, file=file)
    if node is None:
        src.data = None
        src.lines["$"] = 1
        return src
    src.data = _walk(node, "$", src)
    return src


def _check_bounds(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH and more than MAX_NODES nodes after alias expansion.

    One pass over PyYAML's event stream (its parser is iterative, unlike its composer): per
    anchor, the size and height of the subtree it names; an alias adds them where it stands.
    """
    stack: list[list[Any]] = []  # per open collection: [anchor, expanded nodes, height of its children]
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (expanded nodes, height)
    open_anchors: dict[str, int] = {}
    total = 0
    for ev in yaml.parse(text, Loader=_YAML_LOADER):
        if isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent)):
            nodes, height = 1, 0
            if isinstance(ev, yaml.AliasEvent):
                if open_anchors.get(ev.anchor):
                    raise YamlSyntaxError(
                        f"alias *{excerpt(ev.anchor, 60)} refers to a node that contains it (a cycle)",
                        ev.start_mark.line + 1, "an alias may only repeat a node defined and closed before it",
                    )
                nodes, height = sizes.get(ev.anchor, (1, 0))  # undefined: the composer reports it
            elif ev.anchor is not None:
                sizes[ev.anchor] = (1, 0)
            if len(stack) + height > MAX_DEPTH:
                _too_deep(ev)
        elif isinstance(ev, yaml.CollectionStartEvent):
            if len(stack) + 1 > MAX_DEPTH:
                _too_deep(ev)
            stack.append([ev.anchor, 1, 0])
            if ev.anchor is not None:
                open_anchors[ev.anchor] = open_anchors.get(ev.anchor, 0) + 1
            total += 1
            if total > MAX_NODES:
                _too_many(ev, total)
            continue
        elif isinstance(ev, yaml.CollectionEndEvent):
            anchor, nodes, below = stack.pop()
            height = below + 1
            if anchor is not None:
                sizes[anchor] = (nodes, height)
                open_anchors[anchor] -= 1
            if stack:
                stack[-1][1] += nodes
                stack[-1][2] = max(stack[-1][2], height)
            continue
        else:
            continue
        total += nodes
        if total > MAX_NODES:
            _too_many(ev, total)
        if stack:
            stack[-1][1] += nodes
            stack[-1][2] = max(stack[-1][2], height)


def _forbidden_character(text: str, exc: yaml.reader.ReaderError) -> YamlSyntaxError:
    """The error for a character YAML does not allow (a NUL byte, another control character), at its line
    and column (PyYAML's own message spans two lines and names only an offset)."""
    pos = exc.position if isinstance(exc.position, int) and 0 <= exc.position <= len(text) else 0
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    code = exc.character if isinstance(exc.character, int) else ord(text[pos]) if pos < len(text) else 0
    what = "a NUL byte" if code == 0 else f"character U+{code:04X}"
    return YamlSyntaxError(f"{what} at column {column}: YAML text may not contain control characters", line,
                           "remove it: a spec is plain UTF-8 text")


def _too_deep(ev: yaml.Event) -> None:
    raise YamlSyntaxError(
        f"nesting deeper than {MAX_DEPTH} levels", ev.start_mark.line + 1, _DEEP_HINT,
    )


_DEEP_HINT = "a spec needs a handful of levels; check the brackets and indentation"


def _too_many(ev: yaml.Event, total: int) -> None:
    what = "aliases expand" if isinstance(ev, yaml.AliasEvent) else "the document grows"
    raise YamlSyntaxError(
        f"{what} to more than {MAX_NODES:,} YAML nodes here", ev.start_mark.line + 1,
        "anchors and aliases must not multiply the document (a 'billion laughs' is refused)",
    )


def _construct(node: yaml.Node) -> Any:
    try:
        return _loader().construct_object(node, deep=True)
    except Exception as exc:  # constructing a scalar from user text: any failure is the text's
        msg = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
        what = f"the value {show(node.value)}" if isinstance(node, yaml.ScalarNode) else f"a {node.tag} value"
        raise YamlSyntaxError(
            f"cannot read {what}: {excerpt(msg)}", node.start_mark.line + 1, "quote it to make it a string, or fix it"
        ) from None
    finally:
        loader = _loader()
        loader.constructed_objects.clear()
        loader.recursive_objects.clear()


def _walk(node: yaml.Node, path: str, src: YamlSource) -> Any:
    src.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlSyntaxError(
                    "a mapping key must be a scalar (a name or a number), not a list or mapping",
                    key_node.start_mark.line + 1,
                )
            key = _construct(key_node)
            sub = child_path(path, key if isinstance(key, (str, int)) else str(key))
            if key in out:
                src.duplicates.append((sub, key_node.start_mark.line + 1))
            src.lines[sub] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, sub, src)
            src.lines[sub] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, child_path(path, i), src) for i, item in enumerate(node.value)]
    return _construct(node)


_LOADER: yaml.SafeLoader | None = None


def _loader() -> yaml.SafeLoader:
    global _LOADER
    if _LOADER is None:
        _LOADER = yaml.SafeLoader("")
    return _LOADER
