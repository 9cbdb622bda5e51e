"""Expression and nest helpers shared by the strategies that rewrite across nests and expressions: the graph
family (`graph.py`, `tensor_split_concat.py`, `eliminations.py`), the online and the algebraic families.

Everything rebuilds AST nodes: variables are substituted structurally, sub-expressions are addressed by
paths of child positions, and no helper ever edits LEIR text.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterator, Mapping

from ..errors import IllegalActionError
from ..ir.analysis import index_range, writes
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                      children, equations, free_vars, map_children, walk)
from ..ir.dtypes import float_rank, is_float
from ..ir.program import Program
from .base import Action
from .util import nest_at

Path = tuple[int, ...]

MAX_THREADS = 1024
"""Largest extent a hoisted nest binds to threadIdx.x."""


# -- nests -------------------------------------------------------------------------------------------------------

def flat_equations(nest: Nest) -> list[Equation] | None:
    """The equations of a nest whose body holds no inner nest, else None."""
    if any(isinstance(s, Nest) for s in nest.body):
        return None
    return list(nest.body)


def flat_nest(program: Program, index) -> tuple[Nest, list[Equation]]:
    """Nest `index` and its equations, or IllegalActionError where it holds an inner nest."""
    nest = nest_at(program, index)
    eqs = flat_equations(nest)
    if eqs is None:
        raise IllegalActionError(f"nest {index} holds an inner nest; this strategy works on flat nests only")
    return nest, eqs


def one_equation(program: Program, index) -> tuple[Nest, Equation]:
    """Flat nest `index` and its only equation, or IllegalActionError."""
    nest, eqs = flat_nest(program, index)
    if len(eqs) != 1:
        raise IllegalActionError(f"nest {index} has {len(eqs)} equations; this strategy needs exactly one")
    return nest, eqs[0]


def names_param(action: Action, key: str) -> tuple[str, ...]:
    """The parameter `key` of an action as a list of distinct names, or IllegalActionError."""
    value = action[key]
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise IllegalActionError(f"{key} must be a list of names, got {value!r}")
    if len(set(value)) != len(value):
        raise IllegalActionError(f"{key} names {list(value)} repeat")
    return value


def reads_own_target(eq: Equation) -> bool:
    """The equation reads the tensor it writes (an accumulation, or a read of another element)."""
    return any(a.name == eq.lhs.name for a in accesses(eq.rhs))


def range_chains(cond: Expr, var: str) -> list[Compare]:
    """The comparison chains (`lo<=v<hi`) of a conjunction that mention loop variable `var`."""
    if isinstance(cond, And):
        return range_chains(cond.lhs, var) + range_chains(cond.rhs, var)
    return [cond] if isinstance(cond, Compare) and var in free_vars(cond) else []


def bounds_of(loops: tuple[Loop, ...]) -> dict[str, int]:
    return {l.var: l.extent for l in loops}


def loops_with_extent(loops: tuple[Loop, ...], var: str, extent: int) -> tuple[Loop, ...]:
    return tuple(replace(l, extent=extent) if l.var == var else l for l in loops)


def map_equation(eq: Equation, fn: Callable[[Expr], Expr]) -> Equation:
    return Equation(fn(eq.lhs), fn(eq.rhs))


def map_nest(nest: Nest, fn: Callable[[Equation], Equation]) -> Nest:
    """The nest with every equation (inner nests included) rewritten by `fn`."""
    body = tuple(map_nest(s, fn) if isinstance(s, Nest) else fn(s) for s in nest.body)
    return replace(nest, body=body)


def map_nest_with_loops(nest: Nest, fn: Callable[[tuple[Loop, ...], Equation], Equation],
                        outer: tuple[Loop, ...] = ()) -> Nest:
    """Like `map_nest`, giving `fn` the loops around each equation too."""
    loops = outer + nest.loops
    body = tuple(map_nest_with_loops(s, fn, loops) if isinstance(s, Nest) else fn(loops, s) for s in nest.body)
    return replace(nest, body=body)


def nest_accesses(nest: Nest) -> Iterator[Access]:
    """Every access of a nest: targets, values and index tensors."""
    for _, eq in equations(nest):
        yield eq.lhs
        yield from accesses(eq.rhs)
        for index in eq.lhs.indices:
            yield from accesses(index)


def with_scope(nest: Nest, dtypes: Mapping[str, str], scope: str) -> Nest:
    """The nest with the tensors named in `dtypes` (name -> the dtype they are stored as) placed in `scope`:
    their writes and the reads at the stored dtype (a read that converts keeps its own spelling, as in the
    reference)."""
    def rescope(expr: Expr) -> Expr:
        expr = map_children(expr, rescope)
        if isinstance(expr, Access) and dtypes.get(expr.name) == expr.dtype:
            return replace(expr, scope=scope)
        return expr

    return map_nest(nest, lambda eq: map_equation(eq, rescope))


def affine_form(expr: Expr) -> dict[str, int] | None:
    """Coefficient per loop variable of an affine integer subscript (constants dropped), or None when the
    subscript is not affine (division, modulo, index tensors, products of variables)."""
    if isinstance(expr, Const):
        return {} if expr.is_int else None
    if isinstance(expr, Var):
        return {expr.name: 1}
    if isinstance(expr, Neg):
        inner = affine_form(expr.operand)
        return None if inner is None else {v: -k for v, k in inner.items()}
    if isinstance(expr, BinOp) and expr.op in ("+", "-"):
        lhs, rhs = affine_form(expr.lhs), affine_form(expr.rhs)
        if lhs is None or rhs is None:
            return None
        sign = 1 if expr.op == "+" else -1
        out = dict(lhs)
        for v, k in rhs.items():
            out[v] = out.get(v, 0) + sign * k
        return {v: k for v, k in out.items() if k}
    if isinstance(expr, BinOp) and expr.op == "*":
        for scaled, factor in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
            if isinstance(factor, Const) and factor.is_int:
                inner = affine_form(scaled)
                return None if inner is None else {v: k * factor.value for v, k in inner.items() if k * factor.value}
    return None


def injective_subscript(indices: tuple[Expr, ...], loops: tuple[Loop, ...]) -> bool:
    """True when the subscript gives each iteration its own element: every loop of more than one iteration
    occurs in exactly one dimension, and each dimension is affine with mixed-radix coefficients (`a*8+c`
    with c < 8), so no two iterations meet."""
    extents = {l.var: l.extent for l in loops}
    seen: set[str] = set()
    for index in indices:
        form = affine_form(index)
        if form is None:
            return False
        terms = sorted(((abs(k), v) for v, k in form.items() if extents.get(v, 1) > 1))
        if seen & {v for _, v in terms}:
            return False
        reach = 0
        for k, v in terms:
            if k <= reach:
                return False
            reach += k * (extents[v] - 1)
            seen.add(v)
    return all(v in seen for v, n in extents.items() if n > 1)


def same_iteration_conflict(loops: tuple[Loop, ...], first: list[Equation], second: list[Equation]) -> str | None:
    """Why running `first` and `second` interleaved (in one nest over `loops`) differs from running all of
    `first` before all of `second`; None when every tensor the two share, with a write on either side, is
    accessed at one subscript that gives each iteration its own element."""
    def touched(eqs: list[Equation]) -> dict[str, list[Access]]:
        found: dict[str, list[Access]] = {}
        for eq in eqs:
            for acc in (eq.lhs, *accesses(eq.rhs), *(a for i in eq.lhs.indices for a in accesses(i))):
                found.setdefault(acc.name, []).append(acc)
        return found

    one, two = touched(first), touched(second)
    written = {eq.lhs.name for eq in first} | {eq.lhs.name for eq in second}
    for name in one:
        if name not in two or name not in written:
            continue
        subscripts = {a.indices for a in one[name] + two[name]}
        if len(subscripts) > 1:
            return f"{name} is accessed at different elements on the two sides"
        if not injective_subscript(next(iter(subscripts)), loops):
            return f"{name} is reused across iterations (a reduction or a broadcast write)"
    return None


# -- expressions -------------------------------------------------------------------------------------------------

def substitute(expr: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """`expr` with every loop variable in `mapping` replaced by its expression, all at once (so that
    `{a: c, c: a}` swaps)."""
    if isinstance(expr, Var):
        return mapping.get(expr.name, expr)
    return map_children(expr, lambda k: substitute(k, mapping))


def shift_var(expr: Expr, var: str, offset: int) -> Expr:
    """`expr` with loop variable `var` replaced by `var+offset`, written as a flat sum where `var` is itself a
    term of one (`c+g` -> `c+g+1`, as the reference writes it; `c*3` -> `(c+1)*3`)."""
    if not offset:
        return expr
    if isinstance(expr, Var):
        return BinOp("+", expr, Const(offset)) if expr.name == var else expr
    new = map_children(expr, lambda k: shift_var(k, var, offset))
    if isinstance(new, BinOp) and new.op == "+" and isinstance(expr.rhs, Var) and expr.rhs.name == var:
        return BinOp("+", BinOp("+", new.lhs, expr.rhs), new.rhs.rhs, new.parens)
    return new


def node_at(expr: Expr, path: Path) -> Expr:
    for step in path:
        kids = children(expr)
        if not isinstance(step, int) or not 0 <= step < len(kids):
            raise IllegalActionError(f"term path {list(path)} leaves the expression")
        expr = kids[step]
    return expr


def replace_at(expr: Expr, path: Path, new: Expr) -> Expr:
    if not path:
        return new
    kids = list(children(expr))
    kids[path[0]] = replace_at(kids[path[0]], path[1:], new)
    it = iter(kids)
    return map_children(expr, lambda _: next(it))


def value_paths(expr: Expr, path: Path = ()) -> Iterator[Path]:
    """Pre-order paths of the value sub-expressions (subscripts are not entered)."""
    yield path
    if isinstance(expr, Access):
        return
    for i, kid in enumerate(children(expr)):
        yield from value_paths(kid, path + (i,))


def under_branch(expr: Expr, path: Path) -> bool:
    """True when the node at `path` sits in a then/else branch of an `if_then_else`, i.e. is evaluated only
    for some iterations."""
    node = expr
    for step in path:
        if isinstance(node, Call) and node.func == "if_then_else" and step > 0:
            return True
        node = children(node)[step]
    return False


def value_accesses(expr: Expr) -> Iterator[Access]:
    """Accesses read as values (not the index tensors inside subscripts)."""
    if isinstance(expr, Access):
        yield expr
        return
    for kid in children(expr):
        yield from value_accesses(kid)


def is_compound(expr: Expr) -> bool:
    """A node worth naming: an operation, not a leaf."""
    return isinstance(expr, (BinOp, Neg, Call))


LITERAL_INT, LITERAL_FLOAT = "literal int", "literal float"
"""Types of literal-only expressions: they take the type of whatever they are combined with."""

_RESAMPLING = ("exp", "log", "sqrt", "erf")
MANTISSA_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def value_dtype(expr: Expr, target: str) -> str | None:
    """The dtype `expr` evaluates to inside an equation whose target has dtype `target`, following LEIR's
    promotion rules (floats win, the wider one; a literal takes the other operand's type, a float literal
    next to an integer the target's float type; integer true division and exp/log/sqrt/erf of an integer
    give the target's float type). Literal-only expressions give LITERAL_INT or LITERAL_FLOAT; None where
    it cannot tell."""
    target_float = target if is_float(target) else "float64"
    if isinstance(expr, Access):
        return expr.dtype
    if isinstance(expr, Const):
        return LITERAL_INT if expr.is_int else LITERAL_FLOAT
    if isinstance(expr, Var):
        return "int64"
    if isinstance(expr, (Compare, And)):
        return "bool"
    if isinstance(expr, Neg):
        return value_dtype(expr.operand, target)
    if isinstance(expr, BinOp):
        lhs, rhs = value_dtype(expr.lhs, target), value_dtype(expr.rhs, target)
        if lhs is None or rhs is None:
            return None
        if expr.op == "/" and not any(is_float(t) or t == LITERAL_FLOAT for t in (lhs, rhs)):
            return LITERAL_FLOAT if {lhs, rhs} == {LITERAL_INT} else target_float
        return _promote(lhs, rhs, target_float)
    if isinstance(expr, Call):
        kinds = [value_dtype(a, target) for a in (expr.args[1:] if expr.func == "if_then_else" else expr.args)]
        if None in kinds:
            return None
        result = kinds[0]
        for kind in kinds[1:]:
            result = _promote(result, kind, target_float)
        if expr.func in _RESAMPLING and not is_float(result):
            return LITERAL_FLOAT if result in (LITERAL_INT, LITERAL_FLOAT) else target_float
        return result
    return None


def _promote(one: str, two: str, target_float: str) -> str:
    literals = (LITERAL_INT, LITERAL_FLOAT)
    if one in literals and two in literals:
        return LITERAL_FLOAT if LITERAL_FLOAT in (one, two) else LITERAL_INT
    if one in literals or two in literals:
        literal, other = (one, two) if one in literals else (two, one)
        return target_float if literal == LITERAL_FLOAT and not is_float(other) else other
    if one == two:
        return one
    floats = [d for d in (one, two) if is_float(d)]
    return max(floats, key=float_rank) if floats else "int64"


def float_valued(expr: Expr, dtype: str) -> bool:
    """True when `expr` evaluates to the float type `dtype` itself (or is literal-only), so storing it in a
    `dtype` tensor and reading it back, or recomputing it in another `dtype` equation, gives the same
    value."""
    return is_float(dtype) and value_dtype(expr, dtype) in (dtype, LITERAL_INT, LITERAL_FLOAT)


def int_range(expr: Expr, bounds: Mapping[str, int]) -> tuple[int, int] | None:
    """`index_range` extended with min, max and abs of integer expressions."""
    if isinstance(expr, Call) and expr.func in ("min", "max", "abs"):
        spans = [int_range(a, bounds) for a in expr.args]
        if None in spans:
            return None
        if expr.func == "abs":
            lo, hi = spans[0]
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        pick = min if expr.func == "min" else max
        return pick(s[0] for s in spans), pick(s[1] for s in spans)
    if isinstance(expr, Neg):
        inner = int_range(expr.operand, bounds)
        return None if inner is None else (-inner[1], -inner[0])
    if isinstance(expr, BinOp) and expr.op in ("+", "-", "*"):
        lhs, rhs = int_range(expr.lhs, bounds), int_range(expr.rhs, bounds)
        if lhs is None or rhs is None:
            return None
        if expr.op == "+":
            return lhs[0] + rhs[0], lhs[1] + rhs[1]
        if expr.op == "-":
            return lhs[0] - rhs[1], lhs[1] - rhs[0]
        products = [a * b for a in lhs for b in rhs]
        return min(products), max(products)
    return index_range(expr, bounds)


def exact_index_value(expr: Expr, dtype: str, bounds: Mapping[str, int]) -> bool:
    """True for integer arithmetic on loop variables and literals (`min(2,128-c*2)`) whose every value is an
    integer the float type `dtype` represents exactly."""
    if any(isinstance(n, Access) for n in walk(expr)) or value_dtype(expr, dtype) != "int64":
        return False
    span = int_range(expr, bounds)
    limit = 2 ** MANTISSA_BITS.get(dtype, 0)
    return span is not None and -limit <= span[0] and span[1] <= limit


def ranges_apart(one: Access, one_bounds: Mapping[str, int], two: Access, two_bounds: Mapping[str, int]) -> bool:
    """True when some dimension's index ranges of the two accesses do not overlap (`D_{0,...}` and
    `D_{1,...}`): they name different elements."""
    for a, b in zip(one.indices, two.indices):
        ra, rb = index_range(a, one_bounds), index_range(b, two_bounds)
        if ra is not None and rb is not None and (ra[1] < rb[0] or rb[1] < ra[0]):
            return True
    return False


def in_bounds(program: Program, access: Access, bounds: Mapping[str, int]) -> bool:
    """True when the access stays inside its tensor for every value of the loop variables."""
    shape = program.tensors[access.name].shape
    for index, extent in zip(access.indices, shape):
        if any(True for _ in accesses(index)):
            return False
        span = index_range(index, bounds)
        if span is None or span[0] < 0 or span[1] >= extent:
            return False
    return True


def safe_everywhere(program: Program, expr: Expr, bounds: Mapping[str, int]) -> bool:
    """True when evaluating `expr` at every iteration reads only elements that exist."""
    return all(in_bounds(program, acc, bounds) for acc in value_accesses(expr))


def affine_coefficient(expr: Expr, var: str) -> int | None:
    """k when `expr` is k*var plus terms free of `var` (0 when var is absent); None when var occurs in any
    other way (division, modulo, index tensors, products of variables)."""
    if var not in free_vars(expr):
        return 0
    if isinstance(expr, Var):
        return 1
    if isinstance(expr, Neg):
        inner = affine_coefficient(expr.operand, var)
        return None if inner is None else -inner
    if isinstance(expr, BinOp) and expr.op in ("+", "-"):
        lhs, rhs = affine_coefficient(expr.lhs, var), affine_coefficient(expr.rhs, var)
        if lhs is None or rhs is None:
            return None
        return lhs + rhs if expr.op == "+" else lhs - rhs
    if isinstance(expr, BinOp) and expr.op == "*":
        for scaled, factor in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
            if isinstance(factor, Const) and factor.is_int:
                inner = affine_coefficient(scaled, var)
                return None if inner is None else inner * factor.value
    return None


def affine_in(access: Access, var: str) -> bool:
    """True when every subscript of the access is affine in `var` (so shifting var shifts the element by
    a constant) and no index tensor is involved."""
    return all(affine_coefficient(i, var) is not None and not any(True for _ in accesses(i))
               for i in access.indices)


def mentions(access: Access, var: str) -> bool:
    return any(var in free_vars(i) for i in access.indices)


def unique_value_subscripts(expr: Expr) -> dict[str, set[tuple[Expr, ...]]]:
    """Tensor name -> the distinct subscripts it is read at (as a value) in `expr`."""
    found: dict[str, set[tuple[Expr, ...]]] = {}
    for acc in value_accesses(expr):
        found.setdefault(acc.name, set()).add(acc.indices)
    return found


def describe_loops(loops: tuple[Loop, ...]) -> str:
    return " x ".join(f"{l.var}({l.extent})" for l in loops) or "no loops"


def trip_count(loops: tuple[Loop, ...]) -> int:
    return math.prod(l.extent for l in loops)


def gpu_bound(nest: Nest) -> bool:
    return any(l.kind == "B" for l in nest.loops)


def compute_nest(source: Nest, expr: Expr, target: Access, dims: tuple[str, ...],
                 order: tuple[str, ...]) -> Nest:
    """A nest over the loops of `source` named in `order` (kinds kept) that stores `expr` into
    `target` subscripted by `dims`. When `source` runs on the GPU and the new nest would bind no axis, its
    first loop (or a single iteration when it has none) is bound to threadIdx.x, as the reference does."""
    loops = [source.loop(v) for v in order]
    loops = [replace(l, kind="L") if l.kind == "V" and i < len(loops) - 1 else l for i, l in enumerate(loops)]
    equation = Equation(replace(target, indices=tuple(Var(d) for d in dims)), expr)
    if gpu_bound(source) and not any(l.kind == "B" for l in loops):
        if not loops:
            loops = [Loop("B", 1, "tx")]
        elif loops[0].extent <= MAX_THREADS and "tx" not in order:
            first = loops[0].var
            loops[0] = Loop("B", loops[0].extent, "tx")
            equation = Equation(substitute(equation.lhs, {first: Var("tx")}),
                                substitute(equation.rhs, {first: Var("tx")}))
    return Nest(tuple(loops), (equation,))


# -- storing a sub-expression in a nest of its own (expression_splitting, common_subexpression_elimination) ---

def hoist_problem(program: Program, nest: Nest, node: Expr, eq: Equation, guarded: bool) -> str | None:
    """Why `node`, a value in `eq`, cannot be stored (at `eq`'s dtype) by a nest placed before `nest`."""
    dtype = eq.lhs.dtype
    if not is_compound(node):
        return "it is a single leaf"
    if not storable(node, eq, nest):
        return f"its value is not exactly representable as {dtype} (another type, or a conversion), so storing " \
               "it would change it"
    touched = {a.name for a in value_accesses(node)} & set(writes(nest))
    if touched:
        return f"it reads {', '.join(sorted(touched))}, which the nest itself writes"
    if guarded and not safe_everywhere(program, node, bounds_of(nest.loops)):
        return "it is evaluated only under a condition and would read outside a tensor elsewhere"
    return None


def storable(node: Expr, eq: Equation, nest: Nest) -> bool:
    """True when storing `node` as `eq`'s dtype and reading it back gives the value `eq` computes with: it is
    of that float dtype already, or it is loop-index arithmetic (`min(2,128-c*2)`) whose every value fits the
    mantissa in an equation that reads floats of that dtype only (so the integer is converted to it
    anyway)."""
    dtype = eq.lhs.dtype
    if float_valued(node, dtype):
        return True
    return is_float(dtype) and exact_index_value(node, dtype, bounds_of(nest.loops)) and all(
        a.dtype == dtype for a in value_accesses(eq.rhs) if is_float(a.dtype))


def vars_in_loop_order(nest: Nest, node: Expr) -> tuple[str, ...]:
    """The nest's loop variables that `node` uses, outermost first."""
    used = set(free_vars(node))
    return tuple(l.var for l in nest.loops if l.var in used)
