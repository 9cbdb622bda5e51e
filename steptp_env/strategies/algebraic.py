"""The twelve algebraic strategies: SymPy rewrites of one equation's value, in six forward/inverse pairs.

An action names its site, `factorization(nest=2, eq=0)`: equation `eq` (in execution order, inner nests
included) of nest `nest`. The value rewritten is the right-hand side, or for an accumulation `X=X+e`
(`-`, `*`, `max`, `min`) the operand `e`, so the reduction keeps its operator and identity. The value goes to
SymPy through `sympy_bridge` (accesses as symbols, subscripts untouched), the strategy's SymPy function
rewrites it, and the result comes back as AST nodes.

| forward (SymPy) | inverse |
|---|---|
| factorization (`factor`) | expand_factorization: `expand` of products and powers of sums |
| cancellation (`cancel`: one fraction p/q, lowest terms) | expand_cancellation: the terms of p each over q, reduced |
| together (`together`: one common denominator) | apart: `apart` in the reads of one tensor (parameter `of`) |
| powsimp (`powsimp`: `exp(a)*exp(b)` -> `exp(a+b)`) | expand_powsimp: `expand` of powers only, the reverse |
| logsimp (`logcombine`: `log(a)+log(b)` -> `log(a*b)`) | expand_log: `expand_log`, `log(a*b)` -> `log(a)+log(b)` |
| collect (`collect` on the factors terms share) | expand_collect: a factor distributed over the one sum it multiplies |

(The reference labels expand_log and logsimp the other way round; here expand_log expands.)

What is offered: the rewrite must change the value's SymPy form (the simplifying strategies factorization,
cancellation, powsimp and collect also offer SymPy's automatic simplification alone, `x+x` -> `2*x`, as the
reference does), and the new right-hand side must differ from the old one by more than operand order and
number spelling (`cosmetic_key`). The log rules need positive arguments and SymPy applies them only to
symbols marked positive: a tensor is marked when the program proves every value it holds positive
(`tensor_signs`: sums of exponentials, squares plus a positive constant, ...), never on the strength of
the inputs. None of these rewrites is bitwise exact, so each is also evaluated in NumPy, in the equation's
dtype, on seeded samples of its leaves at three scales, against the old value in float64; a rewrite that
moves the value beyond `GUARD_RTOL`, or overflows or produces NaN where the old value does not, is refused,
and so is multiplying out a power of a sum outside long reductions (`MIN_SQUARE_EXPANSION_TERMS`).
Verification against the workload stays the final judge.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np
import sympy as sp
from sympy import bottom_up
from sympy.polys.polyerrors import BasePolynomialError

from ..errors import IllegalActionError
from ..ir.analysis import accumulation, reduction
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                      children, equations)
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import bounds_of, describe_loops, float_valued, trip_count
from .sympy_bridge import Bridge, Sign, Unsupported, from_sympy, sum_of, to_sympy
from .util import nest_at

MAX_NODES = 60
"""Largest value (AST nodes) handed to SymPy: factor, cancel and apart grow fast with size."""
MAX_GROWTH = 16
"""A result may have at most twice the nodes of the value plus this many."""
MIN_SQUARE_EXPANSION_TERMS = 32
"""Multiplying out a power of a sum ((x-m)**2 -> x**2-2*x*m+m**2) cancels catastrophically where the sum is
small next to its terms, and a variance divides by it afterwards: offered only as the operand of a
reduction over at least this many terms, where the sum of squares is rarely small next to its terms (the
suite's group norms over 2 and 4 values fail verification expanded; norms over 256 pass)."""
GUARD_RTOL = {"float64": 1e-11, "float32": 2e-6, "float16": 5e-4, "bfloat16": 4e-3}
"""Relative drift allowed on the sampled leaves, about five times tighter than the verify tolerances, since
the rewritten value may feed a reduction."""
GUARD_SCALES = (1.0, 8.0, 30.0)
GUARD_SAMPLES = 192
_SYMPY_FAILS = (ArithmeticError, BasePolynomialError, NotImplementedError, RecursionError, TypeError, ValueError)
"""How SymPy says that a rewrite does not apply to an expression."""


# -- signs: which tensors the program proves positive ---------------------------------------------------------

def _weaker(one: Sign | None, two: Sign | None) -> Sign | None:
    if one is None or two is None:
        return None
    return "pos" if one == two == "pos" else "nonneg"


def _stronger(one: Sign | None, two: Sign | None) -> Sign | None:
    if "pos" in (one, two):
        return "pos"
    return "nonneg" if "nonneg" in (one, two) else None


def expr_sign(expr: Expr, facts: dict[str, Sign]) -> Sign | None:
    """'pos' or 'nonneg' when `expr` is positive (non-negative) for all real values of its unknowns, given
    `facts` about tensors; None when it cannot tell."""
    if isinstance(expr, Const):
        return "pos" if expr.value > 0 else "nonneg" if expr.value == 0 else None
    if isinstance(expr, Var):
        return "nonneg"
    if isinstance(expr, Access):
        return facts.get(expr.name)
    if isinstance(expr, Call):
        signs = [expr_sign(a, facts) for a in expr.args]
        if expr.func == "exp":
            return "pos"
        if expr.func in ("sqrt", "abs"):
            return "pos" if signs[0] == "pos" else "nonneg"
        if expr.func == "max":
            return _stronger(*signs)
        if expr.func in ("min", "if_then_else"):
            return _weaker(*signs[-2:])
        return None
    if isinstance(expr, BinOp):
        lhs, rhs = expr_sign(expr.lhs, facts), expr_sign(expr.rhs, facts)
        if expr.op == "+":
            return _weaker(lhs, rhs) if None in (lhs, rhs) else _stronger(lhs, rhs)
        if expr.op == "*":
            return _weaker(lhs, rhs)
        if expr.op == "/":
            return _weaker(lhs, rhs) if rhs == "pos" else None
        if expr.op == "**":
            even = isinstance(expr.rhs, Const) and expr.rhs.is_int and expr.rhs.value % 2 == 0
            return lhs or ("nonneg" if even else None)
    return None


def _write_sign(eq: Equation, facts: dict[str, Sign]) -> Sign | None:
    """The sign of every value this equation stores: an accumulation starts from its identity (0, 1 or
    -inf) and takes its operand at least once; any other read of its own target proves nothing."""
    acc = accumulation(eq)
    if acc is not None:
        op, operand = acc
        if eq.lhs.name in {a.name for a in accesses(operand)}:
            return None
        return expr_sign(operand, facts) if op in ("+", "*", "max", "min") else None
    if eq.lhs.name in {a.name for a in accesses(eq.rhs)}:
        return None
    return expr_sign(eq.rhs, facts)


def tensor_signs(program: Program) -> dict[str, Sign]:
    """Tensor -> sign that every value the program writes into it has (least fixpoint: a fact is added only
    once all writes of the tensor prove it from facts already established)."""
    writes: dict[str, list[Equation]] = {}
    for nest in program.nests:
        for _, eq in equations(nest):
            writes.setdefault(eq.lhs.name, []).append(eq)
    facts: dict[str, Sign] = {}
    changed = True
    while changed:
        changed = False
        for name, eqs in writes.items():
            found: Sign | None = "pos"
            for eq in eqs:
                found = _weaker(found, _write_sign(eq, facts))
            if found is not None and found != facts.get(name):
                facts[name] = found
                changed = True
    return facts


_SIGNS_CACHE: list[tuple[Program, dict[str, Sign]]] = []


def _signs_of(program: Program) -> dict[str, Sign]:
    """`tensor_signs`, remembered for the last program (candidates ask once per nest)."""
    if not _SIGNS_CACHE or _SIGNS_CACHE[0][0] is not program:
        _SIGNS_CACHE[:] = [(program, tensor_signs(program))]
    return _SIGNS_CACHE[0][1]


# -- canonical form: what counts as a cosmetic difference -----------------------------------------------------

def cosmetic_key(expr: Expr) -> tuple:
    """A key equal for expressions that differ only in operand order of + * max min, in how a sign or a
    subtraction is written, in number spelling (1, 1.0, 1e0) and in parentheses."""
    if isinstance(expr, Const):
        return ("k", float(expr.value))
    if isinstance(expr, Var):
        return ("v", expr.name)
    if isinstance(expr, Access):
        return ("a", expr.name, expr.dtype, tuple(cosmetic_key(i) for i in expr.indices))
    if isinstance(expr, Neg) or (isinstance(expr, BinOp) and expr.op in ("+", "-")):
        terms = sorted((_signed_terms(expr, False)), key=repr)
        return terms[0][1] if len(terms) == 1 and not terms[0][0] else ("+", tuple(terms))
    if isinstance(expr, BinOp) and expr.op in ("*", "/"):
        negative, numer, denom = _factors(expr)
        product = ("*", tuple(sorted(numer, key=repr)), tuple(sorted(denom, key=repr)))
        return ("neg", product) if negative else product
    if isinstance(expr, Call) and expr.func in ("max", "min"):
        return (expr.func, tuple(sorted((cosmetic_key(a) for a in expr.args), key=repr)))
    if isinstance(expr, BinOp):
        return (expr.op, cosmetic_key(expr.lhs), cosmetic_key(expr.rhs))
    if isinstance(expr, Call):
        return (expr.func, tuple(cosmetic_key(a) for a in expr.args))
    if isinstance(expr, Compare):
        return ("cmp", expr.ops, tuple(cosmetic_key(o) for o in expr.operands))
    return ("&", cosmetic_key(expr.lhs), cosmetic_key(expr.rhs))


def _signed_terms(expr: Expr, negative: bool) -> list[tuple[bool, tuple]]:
    if isinstance(expr, Neg):
        return _signed_terms(expr.operand, not negative)
    if isinstance(expr, BinOp) and expr.op in ("+", "-"):
        return _signed_terms(expr.lhs, negative) + _signed_terms(expr.rhs, negative != (expr.op == "-"))
    key = cosmetic_key(expr)
    if key[0] == "neg":
        return [(not negative, key[1])]
    return [(negative, key)]


def _factors(expr: Expr) -> tuple[bool, list[tuple], list[tuple]]:
    """(sign, numerator keys, denominator keys) of a product/quotient chain; a minus on a factor moves to
    the sign."""
    if isinstance(expr, Neg):
        negative, numer, denom = _factors(expr.operand)
        return not negative, numer, denom
    if isinstance(expr, BinOp) and expr.op in ("*", "/"):
        neg1, num1, den1 = _factors(expr.lhs)
        neg2, num2, den2 = _factors(expr.rhs)
        if expr.op == "/":
            num2, den2 = den2, num2
        return neg1 != neg2, num1 + num2, den1 + den2
    return False, [cosmetic_key(expr)], []


# -- operation counts (the cost side of `explain`) -------------------------------------------------------------

def _value_nodes(expr: Expr) -> Iterator[Expr]:
    """Every node of a value expression, without descending into subscripts."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, Access):
            stack.extend(children(node))


def op_counts(expr: Expr) -> Counter:
    """Arithmetic operations and calls one evaluation of a value performs (subscripts not counted)."""
    found: Counter = Counter()
    for node in _value_nodes(expr):
        if isinstance(node, (BinOp, Call)):
            found[node.op if isinstance(node, BinOp) else node.func] += 1
        elif isinstance(node, Neg):
            found["neg"] += 1
        elif isinstance(node, Compare):
            found["compare"] += len(node.ops)
        elif isinstance(node, And):
            found["&"] += 1
    return found


def _describe_ops(counts: Counter) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
    return f"{total} ({parts})" if total else "0"


def _size(expr: Expr) -> int:
    return sum(1 for _ in _value_nodes(expr))


# -- the rewrites ----------------------------------------------------------------------------------------------

def _split_fraction(node: sp.Expr) -> sp.Expr:
    """p/q with p a sum: the sum of each term of p over q, reduced (the inverse of `cancel`'s step of
    bringing terms over one denominator)."""
    if not node.is_Mul:
        return node
    numer, denom = sp.fraction(node)
    if denom == 1 or not numer.is_Add:
        return node
    return sp.Add(*(sp.cancel(term / denom) for term in numer.args))


def _shared_factors(node: sp.Expr) -> list[sp.Expr]:
    """Non-numeric factors that at least two terms of a sum share, most shared first (ties in SymPy's
    order)."""
    counts: Counter = Counter()
    for term in node.args:
        counts.update(set(term.as_coeff_mul()[1]))
    shared = [f for f in sorted(counts, key=sp.default_sort_key) if counts[f] >= 2]
    return sorted(shared, key=lambda f: -counts[f])


def _collect_sum(node: sp.Expr) -> sp.Expr:
    if not node.is_Add:
        return node
    shared = _shared_factors(node)
    return sp.collect(node, shared) if shared else node


def _distribute(node: sp.Expr) -> sp.Expr:
    """A product with exactly one sum among its factors, the other factors distributed over its terms."""
    if not node.is_Mul:
        return node
    sums = [a for a in node.args if a.is_Add]
    if len(sums) != 1:
        return node
    rest = sp.Mul(*(a for a in node.args if a is not sums[0]))
    return sp.Add(*(rest * term for term in sums[0].args))


@lru_cache(maxsize=8192)
def _apart(expr: sp.Expr, symbols: tuple[sp.Symbol, ...]) -> sp.Expr:
    """Partial fractions in the first of `symbols` (SymPy order) in which the expression has them."""
    for symbol in sorted(symbols, key=sp.default_sort_key):
        try:
            result = sp.apart(expr, symbol)
        except _SYMPY_FAILS:
            continue
        if result != expr:
            return result
    return expr


REWRITES: dict[str, Callable[[sp.Expr], sp.Expr]] = {
    "factorization": sp.factor,
    "expand_factorization": lambda e: sp.expand(e, power_exp=False, power_base=False, log=False),
    "cancellation": sp.cancel,
    "expand_cancellation": lambda e: bottom_up(e, _split_fraction),
    "together": sp.together,
    "powsimp": lambda e: sp.powsimp(e, deep=True),
    "expand_powsimp": lambda e: sp.expand(e, deep=True, mul=False, multinomial=False, power_exp=True,
                                          power_base=True, log=False, basic=False),
    "logsimp": lambda e: sp.logcombine(e, force=False),
    "expand_log": lambda e: sp.expand_log(e, deep=True, force=False),
    "collect": lambda e: bottom_up(e, _collect_sum),
    "expand_collect": lambda e: bottom_up(e, _distribute),
}
"""Strategy name -> its SymPy rewrite (apart, which needs the variable, is `Apart.rewritten`)."""


@lru_cache(maxsize=8192)
def _rewritten(name: str, expr: sp.Expr) -> sp.Expr:
    try:
        return REWRITES[name](expr)
    except _SYMPY_FAILS as exc:
        raise IllegalActionError(f"{name} does not apply: SymPy gave up ({type(exc).__name__})") from None


@lru_cache(maxsize=8192)
def _converted(value: Expr, facts: tuple[tuple[str, Sign], ...]) -> tuple[sp.Expr, Bridge]:
    known = dict(facts)
    return to_sympy(value, lambda node: expr_sign(node, known))


# -- numeric guard -----------------------------------------------------------------------------------------------

def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


_CALLS = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs, "erf": _erf, "max": np.maximum,
          "min": np.minimum}
_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "**": np.power}
_PY_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
           "**": lambda a, b: a ** b}


def _evaluate(expr: Expr, leaves: dict[Expr, np.ndarray], dtype: np.dtype):
    """A value expression on arrays of leaf samples, with LEIR's typing: literal-only parts in double
    precision, integers promoted to `dtype` next to floats and in true division."""
    if expr in leaves:
        return leaves[expr]
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Neg):
        return -_evaluate(expr.operand, leaves, dtype)
    if isinstance(expr, BinOp):
        lhs, rhs = _evaluate(expr.lhs, leaves, dtype), _evaluate(expr.rhs, leaves, dtype)
        if not isinstance(lhs, np.ndarray) and not isinstance(rhs, np.ndarray):
            return _PY_OPS[expr.op](lhs, rhs)
        if expr.op == "/" or _is_floating(lhs) or _is_floating(rhs):
            lhs, rhs = _to_float(lhs, dtype), _to_float(rhs, dtype)
        return _OPS[expr.op](lhs, rhs)
    if isinstance(expr, Call) and expr.func == "if_then_else":
        condition, *branches = (_evaluate(a, leaves, dtype) for a in expr.args)
        if any(_is_floating(b) for b in branches):
            branches = [_to_float(b, dtype) for b in branches]
        return np.where(condition, *branches)
    if isinstance(expr, Call):
        args = [_to_float(_evaluate(a, leaves, dtype), dtype) for a in expr.args]
        return _CALLS[expr.func](*args)
    raise TypeError(f"cannot evaluate {print_expr(expr)}")


def _is_floating(value) -> bool:
    return isinstance(value, float) or (isinstance(value, np.ndarray) and value.dtype.kind == "f")


def _to_float(value, dtype: np.dtype):
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind == "f" else value.astype(dtype)
    return np.asarray(value, dtype=dtype)


def _samples(leaves: list[Expr], signs: dict[Expr, Sign | None], loops: tuple[Loop, ...],
             dtype: np.dtype) -> dict[Expr, np.ndarray]:
    """Seeded samples per leaf: loop variables over their loop, integer values in [0, 8), conditions fair
    coins (SymPy took them as unknowns), floats uniform in [-s, s] (in (0, s] or [0, s] where proven
    positive or non-negative) for each scale s."""
    rng = np.random.default_rng(0)
    bounds = bounds_of(loops)
    count = GUARD_SAMPLES * len(GUARD_SCALES)
    drawn = {}
    for leaf in sorted(leaves, key=print_expr):
        if isinstance(leaf, Var):
            drawn[leaf] = rng.integers(0, bounds.get(leaf.name, 8), count)
        elif isinstance(leaf, Access) and not is_float(leaf.dtype):
            drawn[leaf] = rng.integers(0, 8, count)
        elif isinstance(leaf, (Compare, And)):
            drawn[leaf] = rng.random(count) < 0.5
        else:
            low = {"pos": 0.05, "nonneg": 0.0}.get(signs.get(leaf), -1.0)
            parts = [rng.uniform(low * s if low < 0 else low, s, GUARD_SAMPLES) for s in GUARD_SCALES]
            drawn[leaf] = np.concatenate(parts).astype(dtype)
    return drawn


def _column(expr: Expr, leaves: dict[Expr, np.ndarray], dtype: np.dtype) -> np.ndarray:
    """`_evaluate` as float64 values, one per sample (constant values repeated)."""
    value = _to_float(_evaluate(expr, leaves, dtype), dtype).astype(np.float64)
    return np.broadcast_to(value, (GUARD_SAMPLES * len(GUARD_SCALES),))


def _drift(before: Expr, after: Expr, leaves: list[Expr], signs: dict[Expr, Sign | None],
           loops: tuple[Loop, ...], dtype_name: str) -> str | None:
    """Why `after` is not a safe replacement for `before` on sampled leaves; None when it is, "" when it
    even gives bitwise the same values there."""
    dtype = np.dtype("float32" if dtype_name == "bfloat16" else dtype_name)
    drawn = _samples(leaves, signs, loops, dtype)
    exact = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in drawn.items()}
    with np.errstate(all="ignore"):
        try:
            ref = _column(before, exact, np.dtype(np.float64))
            old, new = _column(before, drawn, dtype), _column(after, drawn, dtype)
        except (ArithmeticError, TypeError, ValueError):
            return "it cannot be evaluated on sampled values"
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        if not np.array_equal(test(old), test(new)):
            return f"it gives {name} at other sampled values than the original"
    finite = np.isfinite(old) & np.isfinite(ref)
    if np.array_equal(old[np.isfinite(old)], new[np.isfinite(old)]):
        return ""
    if not finite.any():
        return None
    scale = float(np.mean(np.abs(ref[finite])))
    allowed = GUARD_RTOL[dtype_name] * (np.abs(ref) + scale) + 4 * np.abs(old - ref)
    worst = np.abs(new - ref)[finite] - allowed[finite]
    if worst.max() > 0:
        return "it drifts beyond the tolerance on sampled values"
    return None


@lru_cache(maxsize=4096)
def _guard(before: Expr, after: Expr, loops: tuple[Loop, ...], dtype: str,
           facts: tuple[tuple[str, Sign], ...]) -> str | None:
    known = dict(facts)
    _, bridge = _converted(before, facts)
    leaves = list(bridge.nodes.values())
    return _drift(before, after, leaves, {leaf: expr_sign(leaf, known) for leaf in leaves}, loops, dtype)


# -- sites -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rewrite:
    """One rewrite of one equation: where it is, the equation before and after, the sign facts SymPy could
    use, and how it came out on the guard's samples."""

    index: int
    eq_index: int
    loops: tuple[Loop, ...]
    before: Equation
    after: Equation
    op: str | None
    signs: tuple[tuple[str, Sign], ...]
    normal_form_only: bool
    exact_on_samples: bool


def _value(eq: Equation, where: str) -> tuple[str | None, Expr]:
    """(accumulation operator or None, the value to rewrite)."""
    if not is_float(eq.lhs.dtype):
        raise IllegalActionError(f"{where} stores into {eq.lhs.dtype} {eq.lhs.name}: only float values are "
                                 "rewritten, integer and index arithmetic is left alone")
    op, value = accumulation(eq) or (None, eq.rhs)
    if eq.lhs.name in {a.name for a in accesses(value)}:
        raise IllegalActionError(f"{where} reads its own target {eq.lhs.name} (a scan or an update): its "
                                 "value is not rewritten")
    if not float_valued(value, eq.lhs.dtype):
        raise IllegalActionError(f"{where} computes in another type than {eq.lhs.dtype} and converts on "
                                 "store: not rewritten")
    if _size(value) > MAX_NODES:
        raise IllegalActionError(f"{where} has a value of {_size(value)} nodes, more than the {MAX_NODES} "
                                 "handed to SymPy")
    return op, value


def _rebuild(eq: Equation, op: str | None, value: sp.Expr, bridge: Bridge) -> Expr:
    """The new right-hand side: the rewritten value, or the accumulation around it with its target first
    (`X+t1-t2+...` for a sum, as the reference writes it)."""
    target = eq.lhs
    if op is None:
        return from_sympy(value, bridge)
    if op == "+":
        return sum_of(target, list(value.as_ordered_terms()) if value.is_Add else [value], bridge)
    new = from_sympy(value, bridge)
    if op in ("-", "*"):
        return BinOp(op, target, new)
    return Call(op, (target, new) if eq.rhs.args[0] == target else (new, target))


def _same_reduction(old: str | None, new: tuple[str, Expr] | None) -> bool:
    if old is None:
        return new is None
    additive = ("+", "-")
    return new is not None and (new[0] == old or (old in additive and new[0] in additive))


def _powers_of_sums(expr: sp.Expr) -> int:
    return sum(1 for node in sp.preorder_traversal(expr)
               if node.is_Pow and node.base.is_Add and node.exp.is_Integer and abs(node.exp) >= 2)


def _reduced_terms(loops: tuple[Loop, ...], eq: Equation) -> int:
    found = reduction(loops, eq)
    return math.prod(l.extent for l in loops if l.var in found.reduced_vars) if found else 1


def _rewrite(strategy: AlgebraicRewrite, program: Program, action: Action) -> _Rewrite:
    """The rewrite `action` makes (at equation `eq` of nest `nest`); IllegalActionError says why not."""
    index, eq_index = action["nest"], action["eq"]
    nest = nest_at(program, index)
    found = list(equations(nest))
    if not isinstance(eq_index, int) or not 0 <= eq_index < len(found):
        raise IllegalActionError(f"nest {index} has {len(found)} equation{'s' if len(found) != 1 else ''}; "
                                 f"there is no equation {eq_index!r}")
    where = f"equation {eq_index} of nest {index}"
    loops, eq = found[eq_index]
    op, value = _value(eq, where)
    known = _signs_of(program)
    facts = tuple(sorted({(a.name, known[a.name]) for a in accesses(eq.rhs) if a.name in known}))
    before, bridge = _converted(value, facts)
    after = strategy.rewritten(before, bridge, action)
    if after == before and not strategy.simplifies:
        raise IllegalActionError(f"{strategy.name} leaves the value of {where} as it is")
    if _powers_of_sums(after) < _powers_of_sums(before) and _reduced_terms(loops, eq) < MIN_SQUARE_EXPANSION_TERMS:
        raise IllegalActionError(f"{strategy.name} at {where} multiplies out a power of a sum, which loses "
                                 "precision where the sum nearly cancels; offered only in reductions over at "
                                 f"least {MIN_SQUARE_EXPANSION_TERMS} terms")
    try:
        new_eq = Equation(eq.lhs, _rebuild(eq, op, after, bridge))
    except Unsupported as exc:
        raise IllegalActionError(f"{strategy.name} at {where} gives a form LEIR cannot write: {exc}") from None
    strategy.check_result(eq, new_eq, where)
    problem = _refusal(eq, new_eq, op, loops, facts)
    if problem:
        raise IllegalActionError(f"{strategy.name} at {where} {problem}")
    signs = tuple((name, sign) for name, sign in facts if name in {a.name for a in accesses(value)})
    return _Rewrite(index, eq_index, loops, eq, new_eq, op, signs, after == before, problem == "")


def _refusal(old: Equation, new: Equation, op: str | None, loops: tuple[Loop, ...],
             facts: tuple[tuple[str, Sign], ...]) -> str | None:
    """Why the rewritten equation is not offered (cosmetic, another accumulation, too large, fails the
    numeric guard); None when it is, "" when it even matches bitwise on the guard's samples."""
    if cosmetic_key(new.rhs) == cosmetic_key(old.rhs):
        return "only reorders operands or respells numbers"
    if not _same_reduction(op, accumulation(new)):
        return f"would change the accumulation form of {old.lhs.name}"
    if _size(new.rhs) > 2 * _size(old.rhs) + MAX_GROWTH:
        return f"grows the expression from {_size(old.rhs)} to {_size(new.rhs)} nodes"
    problem = _guard(old.rhs, new.rhs, loops, old.lhs.dtype, facts)
    return f"is refused: {problem}" if problem else problem


def _replace_equation(nest: Nest, eq_index: int, new: Equation) -> Nest:
    """The nest with its `eq_index`-th equation (execution order, inner nests included) replaced."""
    count = [0]

    def walk(node: Nest) -> Nest:
        body = []
        for stmt in node.body:
            if isinstance(stmt, Nest):
                body.append(walk(stmt))
                continue
            body.append(new if count[0] == eq_index else stmt)
            count[0] += 1
        return replace(node, body=tuple(body))

    return walk(nest)


def _holds(check: Callable[..., object], *args) -> bool:
    try:
        check(*args)
    except IllegalActionError:
        return False
    return True


# -- the strategies ------------------------------------------------------------------------------------------------

class AlgebraicRewrite(Strategy):
    """Rewrite the value of equation `eq` of nest `nest` with this strategy's SymPy function.

    Preconditions: the equation stores a float value computed in its own dtype; it reads its target only as
    an accumulation (`X=X+e`, whose operand `e` is rewritten, keeping the reduction); the value has at most
    `MAX_NODES` nodes; SymPy's result changes the value, differs from it by more than operand order and
    number spelling, has a LEIR form, keeps the accumulation, stays within `MAX_GROWTH`, multiplies out no
    power of a sum outside reductions over `MIN_SQUARE_EXPANSION_TERMS` terms, and passes the numeric
    guard."""

    params = ("nest", "eq")
    nest_local = True
    inverse = ""
    effect = ""
    """What the rewrite did, in a clause ("factored ... into ...")."""
    simplifies = False
    """The simplifying strategies (factorization, cancellation, powsimp, collect) also offer what SymPy's
    automatic simplification does on its own (x+x -> 2*x, x/1 -> x, x*x -> x**2), as the reference does."""

    def nest_context(self, program: Program, index: int) -> tuple:
        facts = _signs_of(program)
        return tuple(sorted((name, facts[name]) for name in {a.name for a in _nest_reads(program.nests[index])}
                            if name in facts))

    def nest_candidates(self, program: Program, index: int, target: str) -> list[Action]:
        return [a for j, (_, eq) in enumerate(equations(program.nests[index]))
                for a in self.site_actions(index, j, eq) if _holds(_rewrite, self, program, a)]

    def site_actions(self, index: int, eq_index: int, eq: Equation) -> list[Action]:
        """The actions to try at one equation (one; apart has one per tensor read)."""
        return [self.action(nest=index, eq=eq_index)]

    def rewritten(self, value: sp.Expr, bridge: Bridge, action: Action) -> sp.Expr:
        """SymPy's rewrite of an equation's value (`bridge` says what its symbols stand for)."""
        return _rewritten(self.name, value)

    def effect_of(self, action: Action) -> str:
        return self.effect

    def check_result(self, old: Equation, new: Equation, where: str) -> None:
        """Raise IllegalActionError where this strategy refuses its own result; default: never."""

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        done = _rewrite(self, program, action)
        nests = list(program.nests)
        nests[done.index] = _replace_equation(nests[done.index], done.eq_index, done.after)
        return program.replace_nests(nests)

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The one equation that differs between the two programs, when exactly one does."""
        if len(before.nests) != len(after.nests):
            return []
        changed = []
        for i, (one, two) in enumerate(zip(before.nests, after.nests)):
            old, new = list(equations(one)), list(equations(two))
            if len(old) != len(new):
                return []
            changed += [(i, j, a[1]) for j, (a, b) in enumerate(zip(old, new)) if a != b]
        return self.site_actions(*changed[0]) if len(changed) == 1 else []

    def matches_spelling(self, result: Program, answer: Program) -> bool:
        """Answers spell numbers and order operands freely (`1e-05` as `1.0e-5`, `K/M+1` as `1.0+(K/M)`):
        the same loops with every equation equal under `cosmetic_key`, the notion that keeps cosmetic-only
        rewrites off the menu, is the same program."""
        if len(result.nests) != len(answer.nests):
            return False
        for one, two in zip(result.nests, answer.nests):
            ours, theirs = list(equations(one)), list(equations(two))
            if len(ours) != len(theirs) or any(
                    a[0] != b[0] or cosmetic_key(a[1].lhs) != cosmetic_key(b[1].lhs)
                    or cosmetic_key(a[1].rhs) != cosmetic_key(b[1].rhs) for a, b in zip(ours, theirs)):
                return False
        return True

    def explain(self, before: Program, action: Action, after: Program) -> str:
        done = _rewrite(self, before, action)
        old, new = op_counts(done.before.rhs), op_counts(done.after.rhs)
        iterations = trip_count(done.loops)
        delta = (sum(new.values()) - sum(old.values())) * iterations
        where = (f"equation {done.eq_index} of nest {done.index} ({print_expr(done.before.lhs)}, inside "
                 f"{describe_loops(done.loops)})")
        value = (f"the operand of its {done.op} accumulation, so the reduction keeps its operator and identity"
                 if done.op else "its right-hand side")
        facts = (" SymPy could use that " + " and ".join(f"{n} is {_SIGN_WORDS[s]}" for n, s in done.signs)
                 + ", which the program proves: every value it writes there is." if done.signs else "")
        rounding = ("the rewrite regroups floating-point operations, so rounding can change: it gave bitwise the "
                    "same values on the sampled inputs, but need not elsewhere" if done.exact_on_samples else
                    "the rewrite regroups floating-point operations, so rounding changes and the result is not "
                    "bitwise identical")
        change = "saves" if delta < 0 else "adds"
        how = (" SymPy's automatic simplification made this change on its own; the rewrite itself had "
               "nothing further to do." if done.normal_form_only else "")
        return (f"{self.name} {self.effect_of(action)} at {where}, rewriting {value}: {print_expr(done.before.rhs)} "
                f"became {print_expr(done.after.rhs)}.{how} It is legal because the rewrite is an algebraic identity "
                "for real values wherever the original is defined, with the tensor reads treated as "
                f"independent symbols; no subscript, loop or other equation changes.{facts} Operations per "
                f"iteration: {_describe_ops(old)} before, {_describe_ops(new)} after, which {change} "
                f"{abs(delta)} over the {iterations} iterations. Numerically {rounding} (checked on sampled "
                f"inputs in {done.before.lhs.dtype}; verification decides). The inverse strategy is "
                f"{self.inverse}.")


_SIGN_WORDS = {"pos": "positive", "nonneg": "non-negative"}


class Apart(AlgebraicRewrite):
    """Partial fractions (SymPy apart) of equation `eq` of nest `nest` in the reads of tensor `of`:
    `apart(nest=0, eq=1, of=O)` decomposes in the first access of O (SymPy order) in which the value has
    them. A value with several tensors decomposes differently in each (the reference takes whichever its
    SymPy call names), so each tensor read is a site; a tensor whose decomposition repeats that of a tensor
    earlier by name is not offered again.

    Preconditions: those of every algebraic rewrite (see `AlgebraicRewrite`), the value reads `of`, and the
    result reads nothing more often than the value did (`check_result`)."""

    params = ("nest", "eq", "of")

    def site_actions(self, index: int, eq_index: int, eq: Equation) -> list[Action]:
        return [self.action(nest=index, eq=eq_index, of=name) for name in sorted({a.name for a in accesses(eq.rhs)})]

    def nest_candidates(self, program: Program, index: int, target: str) -> list[Action]:
        found, seen = [], set()
        for j, (_, eq) in enumerate(equations(program.nests[index])):
            for action in self.site_actions(index, j, eq):
                try:
                    key = (j, cosmetic_key(_rewrite(self, program, action).after.rhs))
                except IllegalActionError:
                    continue
                if key not in seen:
                    seen.add(key)
                    found.append(action)
        return found

    def rewritten(self, value: sp.Expr, bridge: Bridge, action: Action) -> sp.Expr:
        symbols = tuple(s for s, node in bridge.nodes.items() if isinstance(node, Access) and node.name == action["of"])
        if not symbols:
            raise IllegalActionError(f"the value at equation {action['eq']} of nest {action['nest']} reads no "
                                     f"tensor {action['of']!r}")
        return _apart(value, symbols)

    def effect_of(self, action: Action) -> str:
        return f"decomposed a fraction into partial fractions in the reads of {action['of']} (SymPy apart)"

    def check_result(self, old: Equation, new: Equation, where: str) -> None:
        """No read may occur more often than before. SymPy's apart also multiplies out the part of the value
        that does not contain `of`, distributing a factor over a difference (`G*(4*O-Q)` -> `4*G*O-G*Q`),
        which loses precision where the difference nearly cancels: in group norm, O minus its group mean
        moved the result by 7e-5 relative in float32. Partial fractions themselves never need a second
        read of anything."""
        before = Counter(replace(a, parens=0) for a in accesses(old.rhs))
        after = Counter(replace(a, parens=0) for a in accesses(new.rhs))
        more = sorted(print_expr(a) for a in after if after[a] > before[a])
        if more:
            raise IllegalActionError(f"apart at {where} would read {', '.join(more)} more often than before "
                                     "(a factor distributed over a sum, which can lose precision)")


def _nest_reads(nest: Nest) -> Iterator[Access]:
    for _, eq in equations(nest):
        yield from accesses(eq.rhs)


def _strategy(name: str, inverse: str, effect: str, simplifies: bool) -> type[AlgebraicRewrite]:
    """One registered strategy class: its name, its inverse and the clause `explain` uses."""
    cls = type(name.title().replace("_", ""), (Apart if name == "apart" else AlgebraicRewrite,),
               {"name": name, "inverse": inverse, "effect": effect, "simplifies": simplifies,
                "__doc__": (Apart if name == "apart" else AlgebraicRewrite).__doc__})
    return register(cls)


PAIRS = (
    ("factorization", "expand_factorization", "factored the value into products of simpler factors (SymPy factor)",
     "multiplied out products and powers of sums (SymPy expand)"),
    ("cancellation", "expand_cancellation",
     "brought the value over one denominator with common factors cancelled (SymPy cancel)",
     "split a fraction into the terms of its numerator, each over the denominator and reduced"),
    ("together", "apart", "combined the fractions over a common denominator (SymPy together)",
     "decomposed a fraction into partial fractions (SymPy apart)"),
    ("powsimp", "expand_powsimp", "combined powers and exponentials with common bases (SymPy powsimp)",
     "split powers and exponentials of sums into products (exp(a+b) -> exp(a)*exp(b))"),
    ("logsimp", "expand_log", "combined sums of logarithms into the logarithm of a product (SymPy logcombine)",
     "split the logarithm of a product or power into a sum of logarithms (SymPy expand_log)"),
    ("collect", "expand_collect", "collected terms sharing a factor into factor*(sum) (SymPy collect)",
     "distributed a factor over the sum it multiplies"),
)
"""(forward, inverse, what forward does, what inverse does)."""

SIMPLIFYING = ("factorization", "cancellation", "powsimp", "collect")

for _forward, _inverse, _forward_effect, _inverse_effect in PAIRS:
    _strategy(_forward, _inverse, _forward_effect, _forward in SIMPLIFYING)
    _strategy(_inverse, _forward, _inverse_effect, False)
