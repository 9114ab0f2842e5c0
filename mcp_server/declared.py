"""The tools' declared input schemas are what the server accepts: one gate, before any tool runs.

The SDK validates arguments with pydantic in lax mode after guessing JSON inside strings
(``rank: "1"`` and ``rank: true`` became rank 1, ``spec_text: '{"version": 1}'`` a mapping), and
ignores unknown arguments; the schema a client reads said otherwise. Here every tool is built by
:class:`ToolSet`, which declares ``additionalProperties: false`` (and, where given, "exactly one
of" a set of arguments) and turns the SDK's guessing off, and :func:`middleware` checks each
``tools/call``'s arguments against the tool's declared schema with ``jsonschema``: a call the
schema refuses is an ``is_error`` result naming each argument at fault (``rank: expected integer,
got string '1'``); a call it admits reaches the tool unchanged. ``prompts/get`` with an unknown
prompt or a missing or unknown argument is a JSON-RPC ``-32602`` (invalid params) error, not an
internal error with a traceback in the server's log.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent

from mcp_server.roots import clip, excerpt

MAX_LINES = 10  # problems listed per refused call


class _AsDeclared(FuncMetadata):
    """The SDK's argument handling without its JSON-in-strings guess: arguments that passed the declared
    schema are validated as they are (a string stays a string)."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return dict(data)


class ToolSet:
    """Collects the server's tools (``@tools.tool(...)`` / ``tools.add_tool(fn, ...)``, as on ``MCPServer``),
    each with a declared schema that says exactly what :func:`middleware` accepts."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.validators: dict[str, jsonschema.Draft202012Validator] = {}

    def add_tool(self, fn: Callable[..., Any], *, title: str | None = None, description: str | None = None,
                 exactly_one_of: Sequence[str] = ()) -> None:
        tool = Tool.from_function(fn, title=title, description=description)
        meta = tool.fn_metadata
        tool.fn_metadata = _AsDeclared(**{name: getattr(meta, name) for name in FuncMetadata.model_fields})
        schema = tool.parameters
        schema["additionalProperties"] = False
        if exactly_one_of:  # given and not null
            schema["oneOf"] = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                               for name in exactly_one_of]
        jsonschema.Draft202012Validator.check_schema(schema)
        self.tools[tool.name] = tool
        self.validators[tool.name] = jsonschema.Draft202012Validator(schema)

    def tool(self, *, title: str | None = None, exactly_one_of: Sequence[str] = ()) -> Callable[[Any], Any]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_tool(fn, title=title, exactly_one_of=exactly_one_of)
            return fn

        return register

    def problems(self, name: str, arguments: dict[str, Any]) -> list[str]:
        """Why ``arguments`` do not match tool ``name``'s declared schema, one line per problem (empty: they do)."""
        validator = self.validators[name]
        lines: list[str] = []
        for err in sorted(validator.iter_errors(arguments), key=lambda e: [str(p) for p in e.absolute_path]):
            for line in _describe(err, validator.schema):
                if line not in lines:
                    lines.append(line)
        if len(lines) > MAX_LINES:
            lines = lines[:MAX_LINES] + [f"... and {len(lines) - MAX_LINES} more problem(s)"]
        return lines


def middleware(tools: ToolSet, server: MCPServer) -> Any:
    """A ServerMiddleware: ``tools/call`` arguments checked against the declared schema, ``prompts/get`` against
    the prompt's declared arguments."""

    async def check(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        if ctx.method == "tools/call" and params.get("name") in tools.tools:
            args = params.get("arguments")
            lines = tools.problems(str(params["name"]), {} if args is None else args) if isinstance(args, dict | None) \
                else ["arguments: expected an object of named arguments"]
            if lines:
                return CallToolResult(content=[TextContent(type="text", text=clip("\n".join(lines)))], is_error=True)
        elif ctx.method == "prompts/get":
            await _check_prompt(server, params)
        return await call_next(ctx)

    return check


async def _check_prompt(server: MCPServer, params: dict[str, Any]) -> None:
    """An MCPError (invalid params) for an unknown prompt or a missing, unknown or non-string argument."""
    prompts = {p.name: p for p in await server.list_prompts()}
    name = params.get("name")
    prompt = prompts.get(name) if isinstance(name, str) else None
    if prompt is None:
        raise MCPError(INVALID_PARAMS, f"unknown prompt {excerpt(name)}; prompts: {', '.join(sorted(prompts))}")
    args = params.get("arguments") or {}
    declared = {a.name: a for a in prompt.arguments or ()}
    lines = [f"{a}: required argument of prompt {prompt.name}" for a, d in declared.items() if d.required and a not in args]
    for key in sorted(set(args) - set(declared), key=str)[:MAX_LINES]:
        lines.append(_unknown(str(key), list(declared)))
    lines += [f"{k}: expected a string, got {_json_type(v)}" for k, v in args.items() if k in declared and not isinstance(v, str)]
    if lines:
        raise MCPError(INVALID_PARAMS, clip("\n".join(lines)))


# ---- messages ---------------------------------------------------------------------------------------------


def _where(path: Sequence[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "arguments"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _shown(value: Any) -> str:
    """A value as a short excerpt in JSON terms (``'1'`` for a string, ``true``, ``null``)."""
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, (dict, list)):
        return f"{_json_type(value)} of {len(value)} item(s)"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return _json_type(value)
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text)} chars)"


def _unknown(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1) if len(key) <= 100 else []
    shown = key if len(key) <= 100 else excerpt(key, 60)
    return (f"{shown}: unknown argument" + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (arguments: {', '.join(allowed)})")


def _form(schema: dict[str, Any]) -> str:
    """What a schema (one branch of an anyOf) admits, in words."""
    if "description" in schema and "type" in schema and len(schema) <= 4:
        return str(schema["description"])
    kind = schema.get("type")
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if kind == "null":
        return "null"
    if kind in ("integer", "number"):
        bounds = [f">= {schema['minimum']}"] if "minimum" in schema else []
        bounds += [f"<= {schema['maximum']}"] if "maximum" in schema else []
        return f"an {kind}" if kind == "integer" and not bounds else f"a {kind}" if not bounds else \
            f"{'an' if kind == 'integer' else 'a'} {kind} {' and '.join(bounds)}"
    if kind == "string":
        return "a string" + (f" matching {schema['pattern']}" if "pattern" in schema else "")
    return f"a{'n' if str(kind)[:1] in 'aeiou' else ''} {kind}" if kind else "a value of another form"


def _describe(err: jsonschema.ValidationError, root: dict[str, Any]) -> list[str]:
    where, value, v, limit = _where(err.absolute_path), err.instance, err.validator, err.validator_value
    if v == "additionalProperties" and isinstance(value, dict):
        allowed = list(err.schema.get("properties", {}))
        patterns = list(err.schema.get("patternProperties", {}))
        extra = [k for k in value if k not in allowed and not any(re.search(p, k) for p in patterns)]
        if not err.absolute_path:
            return [_unknown(str(k), allowed) for k in extra]
        return [f"{where}.{excerpt(str(k), 60)}: unknown key" + (f" (keys: {', '.join(allowed)})" if allowed else "")
                for k in extra]
    if v == "required":
        missing = [k for k in limit if isinstance(value, dict) and k not in value]
        return [f"{(where + '.') if err.absolute_path else ''}{k}: required" for k in missing]
    if v == "oneOf" and not err.absolute_path and err.schema is root:
        names = [b["required"][0] for b in limit]
        return [f"{names[0]}: give exactly one of {' or '.join(names)}"]
    if v == "type":
        want = limit if isinstance(limit, str) else " or ".join(limit)
        return [f"{where}: expected {want}, got {_json_type(value)} {_shown(value)}"]
    if v in ("anyOf", "oneOf"):
        deeper = [e for e in err.context or () if e.validator != "type"]  # in the branches of the value's type
        if deeper:
            return [line for e in deeper for line in _describe(e, root)]
        forms = [_form(b) for b in limit]
        return [f"{where}: {_shown(value)} is not {' or '.join(dict.fromkeys(forms))}"]
    if v == "enum":
        return [f"{where}: {_shown(value)} is not one of {', '.join(json.dumps(o) for o in limit)}"]
    if v in ("minimum", "exclusiveMinimum"):
        return [f"{where}: {_shown(value)} is below the minimum of {limit}"]
    if v in ("maximum", "exclusiveMaximum"):
        return [f"{where}: {_shown(value)} is above the maximum of {limit}"]
    if v == "maxLength":
        return [f"{where}: {len(value)} characters is too long (at most {limit} characters)"]
    if v == "minLength":
        return [f"{where}: at least {limit} character(s) (got {len(value)})"]
    if v in ("maxItems", "minItems"):
        return [f"{where}: {len(value)} item(s); {'at most' if v == 'maxItems' else 'at least'} {limit}"]
    if v == "pattern":
        what = err.schema.get("description")  # a short one says it in words (round_bytes' sizes)
        return [f"{where}: {_shown(value)} is not {what}" if what and len(what) <= 200
                else f"{where}: {_shown(value)} does not match {limit}"]
    return [f"{where}: {excerpt(err.message, 200)}"]
