"""Tiny, safe expressions used by rules: ``num_kv_heads``, ``vocab_multiple * tp``,
``tie_word_embeddings and pp > 1``.

Allowed: integer/bool constants, names (model params, preset/spec params, mesh
sizes), ``+ - * // %``, comparisons, ``and or not``. Nothing else is evaluated.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


class ExprError(ValueError):
    """An expression that cannot be parsed or names something unknown."""


def evaluate(expr: int | bool | str, names: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` (a literal or an expression string) against ``names``."""
    if isinstance(expr, (bool, int)):
        return expr
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {expr!r}") from exc
    return _eval(tree.body, names, str(expr))


def evaluate_int(expr: int | str, names: Mapping[str, Any]) -> int:
    value = evaluate(expr, names)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExprError(f"expression {expr!r} is {value!r}, not an integer")
    return value


def _eval(node: ast.AST, names: Mapping[str, Any], src: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("true", "True"):
            return True
        if node.id in ("false", "False"):
            return False
        if node.id not in names:
            known = ", ".join(sorted(names))
            raise ExprError(f"unknown name {node.id!r} in {src!r} (known: {known})")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, names, src), _eval(node.right, names, src)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise ExprError(f"division by zero in {src!r}")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, names, src)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, names, src)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, names, src) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names, src)
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                break
            right = _eval(comp, names, src)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        else:
            return True
    raise ExprError(f"unsupported expression {src!r} (use names, integers, + - * // %, comparisons, and/or/not)")
