"""LEIR value expressions to SymPy and back, on the AST (never on text).

Accesses become real symbols (integer ones for integer tensors, positive or non-negative ones where the
caller proved it), loop variables used as values become non-negative integer symbols, and every subtree
SymPy must not reason about (comparisons, `//`, `%`, `inf`) becomes an opaque real symbol that maps back
to the very node it stands for. `if_then_else` becomes `IfThenElse(condition, then, else)` with an opaque
condition, so SymPy may rewrite the branches but never reasons about which one is taken. Subscripts are
never converted: they stay inside the access they belong to.

`from_sympy` builds the AST the way SymPy's `str` printer lays an expression out (term and factor order,
numerator over denominator, `sqrt`, a leading minus on the first factor), so a rewritten right-hand side
prints like the rows of the Step-TP reference, which printed SymPy results. Float constants keep the
spelling they had in the source when their value is unchanged; new ones are written with Python's shortest
round-trip `repr`; a factor 1.0 that SymPy's float arithmetic leaves in a product is not written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import sympy as sp
from sympy.core.logic import fuzzy_and
from sympy.core.mul import _keep_coeff

from ..ir.ast import Access, And, BinOp, Call, Compare, Const, Expr, Neg, Var
from ..ir.dtypes import is_float
from ..ir.printer import print_expr

Sign = str
"""'pos' (> 0) or 'nonneg' (>= 0): what the caller proved about a value."""

_FUNCTIONS = {"exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt, "abs": sp.Abs, "erf": sp.erf,
              "max": sp.Max, "min": sp.Min}
_NAMES = {sp.exp: "exp", sp.log: "log", sp.Abs: "abs", sp.erf: "erf"}


class IfThenElse(sp.Function):
    """LEIR's `if_then_else(c, a, b)` for SymPy: an unknown function of an opaque condition and two branches
    (a branch is rewritten by identities that hold for every real value, so whichever branch runs, its
    value is unchanged)."""

    nargs = 3

    def _eval_is_real(self):
        return fuzzy_and(branch.is_real for branch in self.args[1:])

    def _eval_is_positive(self):
        return fuzzy_and(branch.is_positive for branch in self.args[1:])

    def _eval_is_nonnegative(self):
        return fuzzy_and(branch.is_nonnegative for branch in self.args[1:])


class Unsupported(Exception):
    """A SymPy expression with no LEIR form (complex values, infinities, functions LEIR lacks)."""


@dataclass
class Bridge:
    """What the symbols of one converted expression stand for, and the source spelling of its floats."""

    nodes: dict[sp.Symbol, Expr] = field(default_factory=dict)
    texts: dict[float, str] = field(default_factory=dict)


SignOf = Callable[[Expr], "Sign | None"]


def to_sympy(expr: Expr, sign_of: SignOf) -> tuple[sp.Expr, Bridge]:
    """The SymPy form of a value expression; `sign_of` tells what is proven about the sign of a leaf (an
    access or an opaque subtree)."""
    bridge = Bridge()
    return _convert(expr, sign_of, bridge), bridge


def _symbol(node: Expr, sign: Sign | None, bridge: Bridge, integer: bool = False) -> sp.Symbol:
    """The symbol of a leaf, named by its LEIR text (redundant parentheses dropped, so `(A)` and `A` are
    one symbol)."""
    node = replace(node, parens=0)
    assumptions = {"integer": True} if integer else {"real": True}
    if sign == "pos":
        assumptions["positive"] = True
    elif sign == "nonneg":
        assumptions["nonnegative"] = True
    symbol = sp.Symbol(print_expr(node), **assumptions)
    bridge.nodes[symbol] = node
    return symbol


def _convert(node: Expr, sign_of: SignOf, bridge: Bridge) -> sp.Expr:
    if isinstance(node, Const):
        if node.is_int:
            return sp.Integer(node.value)
        if not math.isfinite(node.value):
            return _symbol(node, None, bridge)
        bridge.texts.setdefault(node.value, node.text or repr(node.value))
        return sp.Float(node.value)
    if isinstance(node, Var):
        return _symbol(node, "nonneg", bridge, integer=True)
    if isinstance(node, Access):
        return _symbol(node, sign_of(node), bridge, integer=not is_float(node.dtype))
    if isinstance(node, Neg):
        return -_convert(node.operand, sign_of, bridge)
    if isinstance(node, BinOp) and node.op in ("+", "-", "*", "/", "**"):
        lhs, rhs = _convert(node.lhs, sign_of, bridge), _convert(node.rhs, sign_of, bridge)
        return {"+": lambda: lhs + rhs, "-": lambda: lhs - rhs, "*": lambda: lhs * rhs,
                "/": lambda: lhs / rhs, "**": lambda: sp.Pow(lhs, rhs)}[node.op]()
    if isinstance(node, Call) and node.func == "if_then_else":
        condition, *branches = node.args
        return IfThenElse(_symbol(condition, None, bridge), *(_convert(b, sign_of, bridge) for b in branches))
    if isinstance(node, Call) and node.func in _FUNCTIONS:
        return _FUNCTIONS[node.func](*(_convert(a, sign_of, bridge) for a in node.args))
    if isinstance(node, (BinOp, Call, Compare, And)):
        return _symbol(node, sign_of(node), bridge)
    raise TypeError(f"not a LEIR expression: {node!r}")


# -- back to the AST -----------------------------------------------------------------------------------------

def from_sympy(expr: sp.Expr, bridge: Bridge) -> Expr:
    """The AST of a SymPy expression; `Unsupported` where LEIR cannot write it."""
    if expr in bridge.nodes:
        return bridge.nodes[expr]
    if expr.is_Number:
        return _number(expr, bridge)
    if expr.is_Add:
        return sum_of(None, expr.as_ordered_terms(), bridge)
    if expr.is_Mul:
        return _product(expr, bridge)
    if expr.is_Pow:
        return _power(expr, bridge)
    if expr is sp.E:
        return Call("exp", (Const(1, "1"),))
    if isinstance(expr, IfThenElse):
        return Call("if_then_else", tuple(from_sympy(a, bridge) for a in expr.args))
    if isinstance(expr, (sp.Max, sp.Min)):
        return _nary("max" if isinstance(expr, sp.Max) else "min", [from_sympy(a, bridge) for a in expr.args])
    if expr.func in _NAMES:
        return Call(_NAMES[expr.func], tuple(from_sympy(a, bridge) for a in expr.args))
    raise Unsupported(f"LEIR has no form for {type(expr).__name__} ({expr})")


def sum_of(start: Expr | None, terms: list[sp.Expr], bridge: Bridge) -> Expr:
    """`start` (or the first term) followed by the terms, each added or, when it prints with a leading
    minus, subtracted: `A - 2*B + C` rather than `A + -2*B + C`."""
    result = start
    for term in terms:
        if result is None:
            result = from_sympy(term, bridge)
            continue
        negative = _prints_negative(term)
        magnitude = _negated(term) if negative else term
        result = BinOp("-" if negative else "+", result, from_sympy(magnitude, bridge))
    if result is None:
        return Const(0, "0")
    return result


def _prints_negative(term: sp.Expr) -> bool:
    if term.is_Number:
        return bool(term.is_negative)
    return bool(term.is_Mul and term.as_coeff_Mul()[0].is_negative)


def _negated(term: sp.Expr) -> sp.Expr:
    coeff, rest = term.as_coeff_Mul()
    return _keep_coeff(-coeff, rest)


def _number(value: sp.Expr, bridge: Bridge) -> Expr:
    if value.is_Integer:
        return _signed(Const(abs(int(value)), str(abs(int(value)))), value.is_negative)
    if value.is_Rational:
        num = _signed(Const(abs(value.p), str(abs(value.p))), value.is_negative)
        return BinOp("/", num, Const(value.q, str(value.q)))
    if value.is_Float:
        number = float(value)
        if not math.isfinite(number):
            raise Unsupported(f"non-finite constant {value}")
        magnitude = abs(number)
        text = bridge.texts.get(magnitude) or repr(magnitude)
        return _signed(Const(magnitude, text), number < 0)
    raise Unsupported(f"LEIR has no form for the number {value}")


def _signed(node: Expr, negative: bool) -> Expr:
    return Neg(node) if negative else node


def _product(expr: sp.Expr, bridge: Bridge) -> Expr:
    """Numerator factors times each other, over the denominator factors (a product in parentheses when
    there are several), with the minus sign on the first factor, as SymPy prints `-2*A*B/(C*D)`."""
    coeff, rest = expr.as_coeff_Mul()
    negative = bool(coeff.is_negative)
    if negative:
        expr = _keep_coeff(-coeff, rest)
    factors = expr.as_ordered_factors() if expr.is_Mul else [expr]
    numer: list[sp.Expr] = []
    denom: list[sp.Expr] = []
    for factor in factors:
        if factor.is_Pow and factor.exp.as_coeff_Mul()[0].is_negative:
            inverse = factor.base if factor.exp == -1 else sp.Pow(factor.base, -factor.exp, evaluate=False)
            denom.append(inverse)
        elif factor.is_Float and abs(float(factor)) == 1.0:
            continue  # SymPy's float domains leave 1.0*(...) behind: a no-op, not written
        elif factor.is_Rational:
            numer += [sp.Integer(factor.p)] if factor.p != 1 else []
            denom += [sp.Integer(factor.q)] if factor.q != 1 else []
        else:
            numer.append(factor)
    top = [from_sympy(f, bridge) for f in numer] or [Const(1, "1")]
    top[0] = _signed(top[0], negative)
    result = _chain("*", top)
    if denom:
        result = BinOp("/", result, _chain("*", [from_sympy(f, bridge) for f in denom]))
    return result


def _chain(op: str, nodes: list[Expr]) -> Expr:
    result = nodes[0]
    for node in nodes[1:]:
        result = BinOp(op, result, node)
    return result


def _power(expr: sp.Expr, bridge: Bridge) -> Expr:
    base, exponent = expr.base, expr.exp
    if base is sp.E:
        return Call("exp", (from_sympy(exponent, bridge),))
    if exponent == sp.S.Half:
        return Call("sqrt", (from_sympy(base, bridge),))
    if exponent.is_Number and exponent.is_negative:
        # 1/x**k rather than x**(-k): an integer base to a negative integer power has no integer value
        inverse = _power(sp.Pow(base, -exponent, evaluate=False), bridge) if exponent != -1 else \
            from_sympy(base, bridge)
        return BinOp("/", Const(1, "1"), inverse)
    return BinOp("**", from_sympy(base, bridge), from_sympy(exponent, bridge))


def _nary(func: str, args: list[Expr]) -> Expr:
    """LEIR's max and min take two arguments: max(a, max(b, c))."""
    if len(args) == 2:
        return Call(func, tuple(args))
    return Call(func, (args[0], _nary(func, args[1:])))
