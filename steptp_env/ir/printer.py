"""The canonical LEIR printer: the inverse of the parser.

Parentheses are the minimum the precedence rules need, plus any redundant ones the source text had
(recorded in the nodes' `parens` field), so `print(parse(text)) == text` for every well-formed text.
"""
from __future__ import annotations

import math

from .ast import Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var
from .dtypes import DTYPE_TO_CODE

_AND, _CMP, _ADD, _MUL, _UNARY, _POW, _ATOM = range(1, 8)
_BINARY_PREC = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "//": _MUL, "%": _MUL, "**": _POW}


def _precedence(node: Expr) -> int:
    if isinstance(node, And):
        return _AND
    if isinstance(node, Compare):
        return _CMP
    if isinstance(node, BinOp):
        return _BINARY_PREC[node.op]
    if isinstance(node, Neg) or (isinstance(node, Const) and node.value < 0):
        return _UNARY
    return _ATOM


def _const_text(node: Const) -> str:
    if node.text:
        return node.text
    value = node.value
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _wrap(node: Expr, needed: bool) -> str:
    count = max(int(needed), node.parens)
    return "(" * count + _bare(node) + ")" * count


def _bare(node: Expr) -> str:
    if isinstance(node, Const):
        return _const_text(node)
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Access):
        head = f"{node.name}^{{{DTYPE_TO_CODE[node.dtype]},{node.scope}}}"
        if not node.indices:
            return head
        return head + "_{" + ",".join(print_expr(i) for i in node.indices) + "}"
    if isinstance(node, Neg):
        return "-" + _wrap(node.operand, _precedence(node.operand) < _UNARY)
    if isinstance(node, BinOp):
        prec = _BINARY_PREC[node.op]
        if node.op == "**":
            left = _wrap(node.lhs, _precedence(node.lhs) <= prec)
            right = _wrap(node.rhs, _precedence(node.rhs) < _UNARY)
        else:
            left = _wrap(node.lhs, _precedence(node.lhs) < prec)
            right = _wrap(node.rhs, _precedence(node.rhs) <= prec)
        return left + node.op + right
    if isinstance(node, Compare):
        parts = [_wrap(node.operands[0], _precedence(node.operands[0]) <= _CMP)]
        for op, operand in zip(node.ops, node.operands[1:]):
            parts.append(op + _wrap(operand, _precedence(operand) <= _CMP))
        return "".join(parts)
    if isinstance(node, And):
        return _wrap(node.lhs, False) + "&" + _wrap(node.rhs, _precedence(node.rhs) <= _AND)
    if isinstance(node, Call):
        return node.func + "(" + ",".join(print_expr(a) for a in node.args) + ")"
    raise TypeError(f"not a LEIR expression: {node!r}")


def print_expr(node: Expr) -> str:
    """LEIR text of an expression."""
    return _wrap(node, False)


def print_loop(loop: Loop) -> str:
    return f"{loop.kind}^{{{loop.extent}}}_{{{loop.var}=0}}"


def print_equation(eq: Equation) -> str:
    return f"{print_expr(eq.lhs)}={print_expr(eq.rhs)};"


def _segment(nest: Nest) -> str:
    inside = "".join(print_nest(s) if isinstance(s, Nest) else print_equation(s)
                     for s in nest.body if not (isinstance(s, Nest) and s.trailing))
    after = "".join(_segment(s) for s in nest.body if isinstance(s, Nest) and s.trailing)
    return "".join(print_loop(l) for l in nest.loops) + "[" + inside + "]" + after


def print_nest(nest: Nest) -> str:
    return _segment(nest) + ";"


def print_nests(nests: tuple[Nest, ...]) -> str:
    """Canonical one-line LEIR text of a program body."""
    return "".join(print_nest(n) for n in nests)
