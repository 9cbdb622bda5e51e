"""Facts the online-algorithm strategies (`online.py`, `value_splits.py`, `shared_then_correct.py`) need about
values, and the expression shapes they build.

`ValueFacts` answers "can this expression be zero, infinite or NaN?" by abstract evaluation over six value
kinds (-inf, negative, zero, positive, +inf, NaN) in exact arithmetic: inputs and parameters are finite data
of any sign, an intermediate has the kinds its writes can produce, `exp` of a finite value is positive, and
so on. It decides `if_then_else` conditions with integer range analysis when the loop bounds settle them, so
`if_then_else(f<=d,Y,-inf)` at `f=0` is known to take the finite branch. Rounding (underflow of `exp` below
about -87 in float32, `log(1+tiny)` rounding to 0) is outside the model; the strategies say so in their
explanations.

One assumption about rows: no row of a max reduction is entirely -inf (a fully masked softmax row is NaN in
the original program too). So a row maximum of values that can be finite is finite, `x - M` with M the row
maximum of the tensor x is read from is at most 0, and a sum of `exp(x - M)` over that row is at least 1.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from ..ir.analysis import accumulation, index_range
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, equations,
                      free_vars)
from ..ir.program import Program
from .graph_util import flat_equations, substitute

NEG_INF, NEG, ZERO, POS, POS_INF, NAN = "-inf", "-", "0", "+", "+inf", "nan"
Kinds = frozenset
FINITE: Kinds = frozenset({NEG, ZERO, POS})
NONZERO_FINITE: Kinds = frozenset({NEG, POS})
ANY: Kinds = frozenset({NEG_INF, NEG, ZERO, POS, POS_INF, NAN})
_SIGN = {NEG_INF: (-1, True), NEG: (-1, False), ZERO: (0, False), POS: (1, False), POS_INF: (1, True)}
_KIND = {v: k for k, v in _SIGN.items()}
_RANK = {NEG_INF: 0, NEG: 1, ZERO: 2, POS: 3, POS_INF: 4}
_FIXPOINT_ROUNDS = 6


# -- the kind algebra (exact arithmetic) ----------------------------------------------------------------------------

def _pairwise(one: Kinds, two: Kinds, op) -> Kinds:
    out: set[str] = set()
    for a in one:
        for b in two:
            out |= {NAN} if NAN in (a, b) else op(_SIGN[a], _SIGN[b])
    return frozenset(out)


def _add(a: tuple[int, bool], b: tuple[int, bool]) -> set[str]:
    (sa, ia), (sb, ib) = a, b
    if ia and ib:
        return {_KIND[a]} if sa == sb else {NAN}
    if ia or ib:
        return {_KIND[a if ia else b]}
    if sa == 0 or sb == 0 or sa == sb:
        return {_KIND[(sa or sb, False)]}
    return set(FINITE)


def _mul(a: tuple[int, bool], b: tuple[int, bool]) -> set[str]:
    (sa, ia), (sb, ib) = a, b
    if (ia and sb == 0) or (ib and sa == 0):
        return {NAN}
    return {_KIND[(sa * sb, (ia or ib) and sa * sb != 0)]}


def _div(a: tuple[int, bool], b: tuple[int, bool]) -> set[str]:
    (sa, ia), (sb, ib) = a, b
    if sb == 0:
        return {NAN} if sa == 0 else {NEG_INF, POS_INF}
    if ib:
        return {NAN} if ia else {ZERO}
    return {_KIND[(sa * sb, ia)]}


def _max(a: tuple[int, bool], b: tuple[int, bool]) -> set[str]:
    return {max(_KIND[a], _KIND[b], key=_RANK.get)}


def _min(a: tuple[int, bool], b: tuple[int, bool]) -> set[str]:
    return {min(_KIND[a], _KIND[b], key=_RANK.get)}


_BINARY = {"+": _add, "*": _mul, "/": _div, "max": _max, "min": _min}


def negate(kinds: Kinds) -> Kinds:
    mirror = {NEG_INF: POS_INF, NEG: POS, ZERO: ZERO, POS: NEG, POS_INF: NEG_INF, NAN: NAN}
    return frozenset(mirror[k] for k in kinds)


def combine(op: str, one: Kinds, two: Kinds) -> Kinds:
    """Kinds of `one op two` for op in + - * / max min."""
    if op == "-":
        return _pairwise(one, negate(two), _add)
    return _pairwise(one, two, _BINARY[op])


def _closure(op: str, kinds: Kinds) -> Kinds:
    """Kinds of a reduction `op` over one or more terms of `kinds`."""
    out = kinds
    for _ in range(_FIXPOINT_ROUNDS):
        grown = out | combine("+" if op == "-" else op, out, kinds)
        if grown == out:
            return out
        out = grown
    return ANY


def _unary(func: str, kinds: Kinds, arg: Expr, facts: ValueFacts) -> Kinds:
    if func == "exp":
        return frozenset({NEG_INF: ZERO, POS_INF: POS_INF, NAN: NAN}.get(k, POS) for k in kinds)
    if func == "log":
        if _exceeds_one(arg, facts):
            return frozenset(POS_INF if k == POS_INF else POS for k in kinds)
        table = {POS: FINITE, ZERO: {NEG_INF}, POS_INF: {POS_INF}}
        return frozenset().union(*(table.get(k, {NAN}) for k in kinds))
    if func == "sqrt":
        return frozenset(k if k in (ZERO, POS, POS_INF) else NAN for k in kinds)
    if func == "abs":
        return _abs(kinds)
    return frozenset({NEG_INF: NEG, POS_INF: POS}.get(k, k) for k in kinds)  # erf


def _abs(kinds: Kinds) -> Kinds:
    return frozenset({NEG: POS, NEG_INF: POS_INF}.get(k, k) for k in kinds)


def _power(base: Kinds, exponent: Kinds, power: Expr) -> Kinds:
    """Kinds of base**power: even integer powers are non-negative, positive bases stay positive."""
    if not base <= FINITE | {POS_INF} or not exponent <= FINITE:
        return ANY
    integral = isinstance(power, Const) and float(power.value).is_integer()
    if integral and power.value % 2 == 0:
        return _abs(base)
    if base <= {POS}:
        return frozenset({POS})
    if integral and power.value > 0:
        return base
    return ANY


def _exceeds_one(expr: Expr, facts: ValueFacts) -> bool:
    """`c + p` with a literal c >= 1 and p positive (the argument of softplus, `log(1+exp(x))`)."""
    if not (isinstance(expr, BinOp) and expr.op == "+"):
        return False
    for const, other in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
        if isinstance(const, Const) and const.value >= 1 and facts.kinds(other) <= {POS, POS_INF}:
            return True
    return False


def data_kinds(dtype: str) -> Kinds:
    """What caller-provided data of `dtype` may hold: finite values (no infinities or NaN in the inputs)."""
    if dtype == "bool" or dtype.startswith("uint"):
        return frozenset({ZERO, POS})
    return FINITE


def const_kinds(value: float | int) -> Kinds:
    if isinstance(value, float) and math.isnan(value):
        return frozenset({NAN})
    if isinstance(value, float) and math.isinf(value):
        return frozenset({POS_INF if value > 0 else NEG_INF})
    return frozenset({ZERO if value == 0 else POS if value > 0 else NEG})


# -- conditions ----------------------------------------------------------------------------------------------------

_DECIDE = {"<": lambda lo, hi: True if hi < 0 else False if lo >= 0 else None,
           "<=": lambda lo, hi: True if hi <= 0 else False if lo > 0 else None,
           ">": lambda lo, hi: True if lo > 0 else False if hi <= 0 else None,
           ">=": lambda lo, hi: True if lo >= 0 else False if hi < 0 else None,
           "==": lambda lo, hi: True if lo == hi == 0 else False if lo > 0 or hi < 0 else None,
           "!=": lambda lo, hi: False if lo == hi == 0 else True if lo > 0 or hi < 0 else None}


def decide(cond: Expr, bounds: Mapping[str, int]) -> bool | None:
    """True or False when the integer condition has that value for every value of the loop variables in
    `bounds`; None when it depends on them or on data."""
    if isinstance(cond, And):
        parts = (decide(cond.lhs, bounds), decide(cond.rhs, bounds))
        return False if False in parts else True if parts == (True, True) else None
    if not isinstance(cond, Compare):
        return None
    verdicts = []
    for left, op, right in zip(cond.operands, cond.ops, cond.operands[1:]):
        span = index_range(BinOp("-", left, right), bounds)
        verdicts.append(None if span is None else _DECIDE[op](*span))
    return False if False in verdicts else True if all(v is True for v in verdicts) else None


# -- abstract evaluation ---------------------------------------------------------------------------------------------

class ValueFacts:
    """Value kinds of the expressions of one program (memoized per tensor)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self._writers: dict[str, list[tuple[tuple[Loop, ...], Equation]]] = {}
        for nest in program.nests:
            for loops, eq in equations(nest):
                self._writers.setdefault(eq.lhs.name, []).append((loops, eq))
        self._tensor: dict[str, Kinds] = {}
        self._row_of: dict[str, str] = {}  # row maximum -> the tensor whose rows it maximizes
        for name, writes in self._writers.items():
            acc = accumulation(writes[0][1]) if len(writes) == 1 else None
            if acc is not None and acc[0] == "max" and isinstance(acc[1], Access):
                self._row_of[name] = acc[1].name

    def _below_row_max(self, expr: Expr) -> bool:
        """`x - M` with M a row maximum of the tensor x reads (at most 0, by the row assumption)."""
        return (isinstance(expr, BinOp) and expr.op == "-" and isinstance(expr.lhs, Access)
                and isinstance(expr.rhs, Access) and self._row_of.get(expr.rhs.name) == expr.lhs.name)

    def kinds(self, expr: Expr, bounds: Mapping[str, int] | None = None, depth: int = 0) -> Kinds:
        """Kinds `expr` may evaluate to. With `bounds` (loop variable -> extent), conditions and single
        elementwise producers are followed at the element read (`depth` limits how far)."""
        if isinstance(expr, Const):
            return const_kinds(expr.value)
        if isinstance(expr, Var) or isinstance(expr, (Compare, And)):
            return frozenset({ZERO, POS})
        if isinstance(expr, Access):
            return self._access(expr, bounds, depth)
        if isinstance(expr, Neg):
            return negate(self.kinds(expr.operand, bounds, depth))
        if isinstance(expr, BinOp):
            return self._binary(expr, bounds, depth)
        if expr.func == "if_then_else":
            verdict = decide(expr.args[0], bounds) if bounds is not None else None
            branches = expr.args[1:] if verdict is None else (expr.args[1] if verdict else expr.args[2],)
            return frozenset().union(*(self.kinds(b, bounds, depth) for b in branches))
        args = [self.kinds(a, bounds, depth) for a in expr.args]
        if expr.func in ("max", "min"):
            return combine(expr.func, *args)
        return _unary(expr.func, args[0], expr.args[0], self)

    def _binary(self, expr: BinOp, bounds, depth: int) -> Kinds:
        one, two = self.kinds(expr.lhs, bounds, depth), self.kinds(expr.rhs, bounds, depth)
        if self._below_row_max(expr):
            return frozenset({NEG, ZERO} | (one & {NEG_INF, NAN}) | ({NAN} if POS_INF in one else set()))
        if expr.op == "*" and expr.lhs == expr.rhs:
            return _abs(one)
        if expr.op in ("+", "-", "*", "/"):
            return combine(expr.op, one, two)
        if expr.op == "**":
            return _power(one, two, expr.rhs)
        return FINITE if one <= FINITE and two <= FINITE else ANY  # // and % of finite integers

    def _access(self, acc: Access, bounds, depth: int) -> Kinds:
        signature = self.program.signature
        if acc.name in signature and signature[acc.name].role != "output":
            return data_kinds(acc.dtype)
        if bounds is not None and depth < 8:
            followed = self._at_element(acc, bounds, depth)
            if followed is not None:
                return followed
        return self.tensor_kinds(acc.name)

    def _at_element(self, acc: Access, bounds, depth: int) -> Kinds | None:
        """Kinds of the single elementwise write that produced the element `acc` reads, or None when the
        tensor has several writes or its write subscript is not a list of distinct loop variables."""
        writers = self._writers.get(acc.name, [])
        if len(writers) != 1:
            return None
        loops, eq = writers[0]
        names = [i.name for i in eq.lhs.indices if isinstance(i, Var)]
        if len(names) != len(eq.lhs.indices) or len(set(names)) != len(names) or accumulation(eq):
            return None
        mapping: dict[str, Expr] = dict(zip(names, acc.indices))
        mapping.update({l.var: Var(f"~{depth}{l.var}") for l in loops if l.var not in mapping})
        return self.kinds(substitute(eq.rhs, mapping), bounds, depth + 1)

    def tensor_kinds(self, name: str) -> Kinds:
        """Kinds of any element of tensor `name` (all its writes, reductions closed over their terms)."""
        if name in self._tensor:
            return self._tensor[name]
        self._tensor[name] = ANY  # a cycle (a scan through another tensor) stays conservative
        found: Kinds = frozenset()
        for _ in range(_FIXPOINT_ROUNDS):
            self._tensor[name] = found
            grown = found.union(*(self._write_kinds(eq, found) for _, eq in self._writers.get(name, [])))
            if grown == found:
                break
            found = grown
        else:
            found = ANY
        self._tensor[name] = found
        return found

    def _write_kinds(self, eq: Equation, current: Kinds) -> Kinds:
        acc = accumulation(eq)
        if acc is None:
            return self.kinds(eq.rhs)  # reads of the tensor itself see `current` through the memo
        op, operand = acc
        terms = self.kinds(operand)
        reduced = _closure(op, terms)
        if op == "max" and terms & FINITE:
            reduced -= {NEG_INF}  # the row assumption: some element of every row is finite
        if op == "+" and isinstance(operand, Call) and operand.func == "exp" and self._below_row_max(operand.args[0]):
            reduced = frozenset({POS} | (terms & {NAN}))  # the row's maximum contributes exp(0) = 1
        return reduced | combine("+" if op == "-" else op, current, reduced) if current else reduced


# -- the expression shapes the strategies build -----------------------------------------------------------------------

MINUS_INF = Neg(Const(math.inf, "inf"))


def previous(index: Expr) -> Expr:
    """`index-1`."""
    return BinOp("-", index, Const(1))


def before_start(index: Expr) -> Expr:
    """`index-1<0`: true at the first element, where a lagging read has no predecessor."""
    return Compare((previous(index), Const(0)), ("<",))


def lagged(acc: Access, dim: int, identity: Expr) -> Expr:
    """`if_then_else(i-1<0, identity, X_{...,i-1,...})`: the predecessor of `acc` along dimension `dim`, or
    `identity` at the first element (the reference's guarded neighbour)."""
    index = acc.indices[dim]
    shifted = replace(acc, indices=acc.indices[:dim] + (previous(index),) + acc.indices[dim + 1:])
    return Call("if_then_else", (before_start(index), identity, shifted))


def extended(acc: Access, index: Expr, dim: int | None = None, scope: str | None = None) -> Access:
    """`acc` with one more subscript, `index`, inserted at position `dim` (default: last), as a scan keeps
    one element per step."""
    dim = acc.rank if dim is None else dim
    return replace(acc, indices=acc.indices[:dim] + (index,) + acc.indices[dim:], scope=scope or acc.scope,
                   parens=0)


def scan_dim(indices: tuple[Expr, ...], loops: tuple[Loop, ...], var: str) -> int:
    """Where a scan along `var` inserts its step subscript into a reduction target's subscript: after the
    leading subscripts that use only loops enclosing `var` (so `I_{tx,c}` reduced over `a` in loops tx,a,c
    becomes `M_{tx,a,c}`, the order of the loops)."""
    outer = {l.var for l in loops[:[l.var for l in loops].index(var)]}
    dim = 0
    while dim < len(indices) and set(free_vars(indices[dim])) <= outer:
        dim += 1
    return dim


def finite_guard(running_max: Access, value: Expr) -> Expr:
    """`if_then_else(M>-inf, value, 0)`: a rescaled running value is 0 while every element so far is -inf,
    instead of the NaN that `exp(-inf-(-inf))` gives."""
    cond = Compare((running_max, MINUS_INF), (">",))
    return Call("if_then_else", (cond, value, Const(0)))


def rename_vars(expr: Expr, mapping: Mapping[str, str]) -> Expr:
    return substitute(expr, {old: Var(new) for old, new in mapping.items()})


def positional_renaming(source: tuple[Loop, ...], target: tuple[Loop, ...]) -> dict[str, str] | None:
    """Loop variable renaming that maps `source` onto `target` position by position, or None when the
    loops differ in number, kind or extent."""
    if [(l.kind, l.extent) for l in source] != [(l.kind, l.extent) for l in target]:
        return None
    return {s.var: t.var for s, t in zip(source, target)}


def single_equation(nest: Nest) -> Equation | None:
    eqs = flat_equations(nest)
    return eqs[0] if eqs is not None and len(eqs) == 1 else None

