"""Program analysis shared by validation, lowering and the strategies.

All functions are pure and work on the AST: index ranges, reductions (with their identity values), prefix
scans, read/write sets, use-def chains between nests and loop-carried dependences.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                  children, equations, free_vars, walk)
from .dtypes import is_float

REDUCE_OPS = ("+", "-", "*", "max", "min")


def index_range(expr: Expr, bounds: Mapping[str, int],
                tensor_ranges: Mapping[str, tuple[int, int]] | None = None) -> tuple[int, int] | None:
    """Smallest interval holding an integer index expression when every loop var v ranges over
    [0, bounds[v]-1] and every index tensor T holds values in tensor_ranges[T]; None where it cannot be
    bounded (unknown index tensors, division by non-constants)."""
    if isinstance(expr, Access):
        return (tensor_ranges or {}).get(expr.name)
    if isinstance(expr, Const):
        return (expr.value, expr.value) if expr.is_int else None
    if isinstance(expr, Var):
        extent = bounds.get(expr.name)
        return None if extent is None else (0, extent - 1)
    if isinstance(expr, Neg):
        inner = index_range(expr.operand, bounds, tensor_ranges)
        return None if inner is None else (-inner[1], -inner[0])
    if isinstance(expr, BinOp):
        lhs, rhs = index_range(expr.lhs, bounds, tensor_ranges), index_range(expr.rhs, bounds, tensor_ranges)
        if lhs is None or rhs is None:
            return None
        if expr.op == "+":
            return lhs[0] + rhs[0], lhs[1] + rhs[1]
        if expr.op == "-":
            return lhs[0] - rhs[1], lhs[1] - rhs[0]
        if expr.op == "*":
            products = [a * b for a in lhs for b in rhs]
            return min(products), max(products)
        if expr.op in ("//", "%") and rhs[0] == rhs[1] and rhs[0] > 0:
            if expr.op == "//":
                return lhs[0] // rhs[0], lhs[1] // rhs[0]
            if lhs[0] >= 0 and lhs[1] < rhs[0]:
                return lhs
            return 0, rhs[0] - 1
    return None


POINT_LIMIT = 1 << 22
"""The most loop iterations `element_positions` enumerates for one access."""
MASK_LIMIT = 1 << 24
"""The most elements of a tensor whose written elements are tracked one by one (a byte each)."""

_INDEX_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod}
_COMPARE_OPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
                "!=": np.not_equal}


def iteration_span(indices: tuple[Expr, ...], loops: tuple[Loop, ...],
                   depth: int) -> tuple[tuple[int, int], ...] | None:
    """The (low, high) of each subscript over one iteration of the first `depth` of `loops` (those held at
    0; an affine subscript spans the same at every value of them), or None where a range is unknown. What a
    tile inside loop `depth - 1` must hold: the size limit a `cache_read_write` tile is checked against and
    the buffer the lowering allocates in that loop are both computed from it."""
    bounds = {l.var: 1 if k < depth else l.extent for k, l in enumerate(loops)}
    spans = tuple(index_range(index, bounds) for index in indices)
    return None if any(span is None for span in spans) else spans


def element_positions(indices: tuple[Expr, ...], shape: tuple[int, ...], bounds: Mapping[str, int],
                      shift_last: int = 0, where: tuple[tuple[Expr, bool], ...] = ()) -> np.ndarray | None:
    """Row-major positions in a tensor of `shape` of the elements that subscripts `indices` name while every
    loop var v ranges over [0, bounds[v]-1], with `shift_last` added to the last subscript (a lagged read),
    at the iterations where each (condition, truth) of `where` holds (a condition on data, which this cannot
    evaluate, is taken to hold everywhere); elements outside the shape are left out, repeats are not. None
    where the subscripts cannot be enumerated: one reads a tensor, an operator other than + - * // %, an
    unbounded variable, or more than POINT_LIMIT iterations. Exact where `index_range` only bounds: it tells
    a strided write (every third element) from a contiguous one."""
    if not indices:
        return np.zeros(1, dtype=np.int64)
    names = sorted({v for e in (*indices, *(c for c, _ in where)) for v in free_vars(e)})
    if any(v not in bounds for v in names) or math.prod(bounds[v] for v in names) > POINT_LIMIT:
        return None
    grid = {v: np.arange(bounds[v], dtype=np.int64).reshape([-1 if k == n else 1 for k in range(len(names))])
            for n, v in enumerate(names)}
    values = [_grid_value(i, grid) for i in indices]
    if any(v is None for v in values):
        return None
    size = tuple(bounds[v] for v in names)
    full = [np.broadcast_to(v, size).ravel() for v in values]
    full[-1] = full[-1] + shift_last
    keep = np.logical_and.reduce([(v >= 0) & (v < extent) for v, extent in zip(full, shape)])
    for cond, truth in where:
        holds = _grid_value(cond, grid)
        if holds is not None:
            keep &= np.broadcast_to(holds == truth, size).ravel()
    return np.ravel_multi_index(tuple(v[keep] for v in full), shape)


def writes_every_element(lhs: Access, bounds: Mapping[str, int], shape: tuple[int, ...]) -> bool:
    """True when subscripts that are distinct loop variables, each running over its whole dimension, make
    the write cover the tensor (the usual operator output): no enumeration needed."""
    names = [i.name for i in lhs.indices if isinstance(i, Var)]
    return (len(names) == len(lhs.indices) == len(shape) and len(set(names)) == len(names)
            and all(bounds.get(v) == extent for v, extent in zip(names, shape)))


def _grid_value(expr: Expr, grid: Mapping[str, np.ndarray]):
    """`expr` evaluated on broadcastable integer arrays of the loop vars; None where it reads a tensor, uses
    a float or an operator not handled here."""
    if isinstance(expr, Var):
        return grid[expr.name]
    if isinstance(expr, Const):
        return np.int64(expr.value) if expr.is_int else None
    if isinstance(expr, Neg):
        inner = _grid_value(expr.operand, grid)
        return None if inner is None else -inner
    if isinstance(expr, BinOp) and expr.op in _INDEX_OPS:
        lhs, rhs = _grid_value(expr.lhs, grid), _grid_value(expr.rhs, grid)
        if lhs is None or rhs is None or (expr.op in ("//", "%") and np.any(rhs == 0)):
            return None
        return _INDEX_OPS[expr.op](lhs, rhs)
    if isinstance(expr, Compare):
        values = [_grid_value(o, grid) for o in expr.operands]
        if any(v is None for v in values):
            return None
        return np.logical_and.reduce([_COMPARE_OPS[op](a, b) for op, a, b in zip(expr.ops, values, values[1:])])
    if isinstance(expr, And):
        lhs, rhs = _grid_value(expr.lhs, grid), _grid_value(expr.rhs, grid)
        return None if lhs is None or rhs is None else lhs & rhs
    return None


def guarded_reads(expr: Expr, where: tuple[tuple[Expr, bool], ...] = ()) -> list[tuple[Access, tuple]]:
    """Every tensor read in `expr` (index tensors inside subscripts included) with the if_then_else
    conditions that must hold, or fail, for it to be read: ((condition, truth), ...), outermost first."""
    if isinstance(expr, Access):
        return [(expr, where)] + [found for index in expr.indices for found in guarded_reads(index, where)]
    if isinstance(expr, Call) and expr.func == "if_then_else":
        cond, then, other = expr.args
        return (guarded_reads(cond, where) + guarded_reads(then, where + ((cond, True),))
                + guarded_reads(other, where + ((cond, False),)))
    return [found for child in children(expr) for found in guarded_reads(child, where)]


def written_elements(program, name: str, before: int) -> np.ndarray | bool | None:
    """Which elements of tensor `name` the nests before `before` write: True when one of them writes it
    whole (`writes_every_element`), else a boolean mask of its shape; None where a write cannot be
    enumerated (`element_positions`) or the tensor has more than MASK_LIMIT elements."""
    shape = program.tensors[name].shape
    writes_ = [(eq.lhs, {l.var: l.extent for l in loops}) for nest in program.nests[:before]
               for loops, eq in equations(nest) if eq.lhs.name == name]
    if any(writes_every_element(lhs, bounds, shape) for lhs, bounds in writes_):
        return True
    if math.prod(shape) > MASK_LIMIT:
        return None
    mask = np.zeros(shape, dtype=bool)
    for lhs, bounds in writes_:
        positions = element_positions(lhs.indices, shape, bounds)
        if positions is None:
            return None
        mask.ravel()[positions] = True
    return mask


def unwritten_reads(program) -> list[tuple[int, Access]]:
    """(nest, access) of every read of an intermediate at elements that no earlier nest wrote, where the
    read is not excluded by an if_then_else condition on loop variables: the kernel would compute with
    whatever the allocator left in that memory, so its result is luck (and, for an index tensor read in a
    subscript, its accesses could land anywhere). Only tensors that earlier nests write are checked (a nest
    reading its own writes, as a reduction or a scan does, is not); writes that `written_elements` cannot
    track leave that tensor unchecked."""
    found = []
    for n, nest in enumerate(program.nests):
        own = set(writes(nest))
        known: dict[str, np.ndarray | bool | None] = {}
        for loops, eq in equations(nest):
            bounds = {l.var: l.extent for l in loops}
            for acc, where in guarded_reads(eq.rhs) + [r for i in eq.lhs.indices for r in guarded_reads(i)]:
                spec = program.signature[acc.name] if acc.name in program.signature else None
                if acc.name in own or (spec is not None and spec.role != "output"):
                    continue
                if acc.name not in known:
                    known[acc.name] = written_elements(program, acc.name, n)
                done = known[acc.name]
                if done is True or done is None or not done.any():
                    continue
                wanted = element_positions(acc.indices, done.shape, bounds, where=where)
                if wanted is not None and not done.ravel()[wanted].all():
                    found.append((n, acc))
    return found


@dataclass(frozen=True, slots=True)
class Reduction:
    """`X = X op e` (or `max/min(X, e)`) over the loop vars absent from X's subscript."""

    op: str
    reduced_vars: tuple[str, ...]
    operand: Expr

    def identity(self, dtype: str) -> int | float:
        return reduction_identity(self.op, dtype)


def reduction_identity(op: str, dtype: str) -> int | float:
    """The value a reduction starts from: 0 for + and -, 1 for *, -inf/+inf for max/min (the dtype's
    extreme value for integers)."""
    if op in ("+", "-"):
        return 0
    if op == "*":
        return 1
    if is_float(dtype):
        return -math.inf if op == "max" else math.inf
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16, "uint32": 32,
            "uint64": 64, "bool": 1}[dtype]
    if dtype.startswith("uint") or dtype == "bool":
        return 0 if op == "max" else 2 ** bits - 1
    return -(2 ** (bits - 1)) if op == "max" else 2 ** (bits - 1) - 1


def accumulation(eq: Equation) -> tuple[str, Expr] | None:
    """(op, operand) when the equation combines its own target element with an operand that does not
    read it: `X=X+e`, `X=X-e`, `X=X*e`, `X=e+X`, `X=e*X`, `X=max(X,e)`, `X=min(e,X)`, and chains whose
    leftmost term is the target, `X=X+e+c-c` (op `+`, operand `e+c-c`) or `X=X*a*b`; else None."""
    rhs, target = eq.rhs, eq.lhs
    if isinstance(rhs, BinOp) and rhs.op in ("+", "-", "*"):
        if rhs.rhs == target and rhs.op != "-" and target not in accesses_of(rhs.lhs):
            return rhs.op, rhs.lhs
        ops = ("*",) if rhs.op == "*" else ("+", "-")
        terms = []
        node: Expr = rhs
        while isinstance(node, BinOp) and node.op in ops:
            terms.append((node.op, node.rhs))
            node = node.lhs
        if node != target or any(target in accesses_of(term) for _, term in terms):
            return None
        terms.reverse()
        if len(terms) == 1:
            return terms[0]
        first_op, operand = terms[0]
        operand = Neg(operand) if first_op == "-" else operand
        for op, term in terms[1:]:
            operand = BinOp(op, operand, term)
        return ("*" if ops == ("*",) else "+"), operand
    if isinstance(rhs, Call) and rhs.func in ("max", "min"):
        first, second = rhs.args
        if first == target and target not in accesses_of(second):
            return rhs.func, second
        if second == target and target not in accesses_of(first):
            return rhs.func, first
    return None


def scan_operator(eq: Equation) -> str:
    """The operator whose identity a scan's first element starts from: the top-level `+ - *` or
    `max`/`min` of the right-hand side, `+` for any other form."""
    rhs = eq.rhs
    if isinstance(rhs, BinOp) and rhs.op in ("+", "-", "*"):
        return rhs.op
    if isinstance(rhs, Call) and rhs.func in ("max", "min"):
        return rhs.func
    return "+"


def accesses_of(expr: Expr) -> list[Access]:
    return list(accesses(expr))


def reduction(loops: tuple[Loop, ...], eq: Equation) -> Reduction | None:
    """The reduction an equation performs inside `loops`, or None when it reduces over no loop var."""
    acc = accumulation(eq)
    if acc is None:
        return None
    used = set()
    for index in eq.lhs.indices:
        used.update(free_vars(index))
    reduced = tuple(l.var for l in loops if l.var not in used)
    return Reduction(acc[0], reduced, acc[1]) if reduced else None


@dataclass(frozen=True, slots=True)
class Scan:
    """An equation that reads its own target at an earlier element along `var` (`X_{i}` from `X_{i-k}`)."""

    tensor: str
    var: str
    offset: int


def scans(loops: tuple[Loop, ...], eq: Equation) -> list[Scan]:
    """The prefix-scan dependences of an equation: reads of its target that lag the write along a loop var."""
    found = []
    for acc in accesses(eq.rhs):
        if acc.name != eq.lhs.name or acc == eq.lhs or acc.rank != eq.lhs.rank:
            continue
        for w, r in zip(eq.lhs.indices, acc.indices):
            if w == r:
                continue
            lag = _lag(w, r)
            if lag is not None:
                found.append(Scan(eq.lhs.name, lag[0], lag[1]))
    return found


def _lag(write: Expr, read: Expr) -> tuple[str, int] | None:
    """(var, k) when `read` is `write - k` with `write` a plain loop var and k a positive constant."""
    if isinstance(write, Var) and isinstance(read, BinOp) and read.lhs == write and isinstance(read.rhs, Const):
        if read.op == "-" and read.rhs.is_int and read.rhs.value > 0:
            return write.name, read.rhs.value
        if read.op == "+" and read.rhs.is_int and read.rhs.value < 0:
            return write.name, -read.rhs.value
    return None


def reads(nest: Nest) -> tuple[str, ...]:
    """Tensors a nest reads (index tensors included), in order of first appearance."""
    names: dict[str, None] = {}
    for _, eq in equations(nest):
        for acc in accesses(eq.rhs):
            names.setdefault(acc.name, None)
        for index in eq.lhs.indices:
            for acc in accesses(index):
                names.setdefault(acc.name, None)
    return tuple(names)


def writes(nest: Nest) -> tuple[str, ...]:
    """Tensors a nest writes, in order of first appearance."""
    names: dict[str, None] = {}
    for _, eq in equations(nest):
        names.setdefault(eq.lhs.name, None)
    return tuple(names)


def use_def(nests: tuple[Nest, ...]) -> list[dict[str, tuple[int, ...]]]:
    """For each nest, the earlier nests that write each tensor it reads (all of them, since a nest may write
    only part of a tensor). Tensors nobody writes (inputs) map to ()."""
    chains = []
    for i, nest in enumerate(nests):
        chains.append({name: tuple(j for j in range(i) if name in writes(nests[j])) for name in reads(nest)})
    return chains


def users(nests: tuple[Nest, ...], index: int) -> tuple[int, ...]:
    """The later nests that read something nest `index` writes."""
    out = set(writes(nests[index]))
    return tuple(j for j in range(index + 1, len(nests)) if out & set(reads(nests[j])))


def carried_dependences(nest: Nest) -> dict[str, tuple[str, ...]]:
    """Loop var -> reasons why iterations of that loop may depend on each other (an empty mapping means
    every loop of the nest can run its iterations in any order). Conservative: reasons are derived from
    reductions, scans, and reads or writes of a written tensor at subscripts that differ from the write."""
    carried: dict[str, list[str]] = {}

    def note(var: str, why: str) -> None:
        reasons = carried.setdefault(var, [])
        if why not in reasons:
            reasons.append(why)

    eqs = list(equations(nest))
    written: dict[str, list[Access]] = {}
    for _, eq in eqs:
        written.setdefault(eq.lhs.name, []).append(eq.lhs)
    for loops, eq in eqs:
        red = reduction(loops, eq)
        write_vars = set()
        for index in eq.lhs.indices:
            write_vars.update(free_vars(index))
        for loop in loops:
            if loop.var not in write_vars:
                why = f"reduction into {eq.lhs.name}" if red else f"{eq.lhs.name} is rewritten in every iteration"
                note(loop.var, why)
        for scan in scans(loops, eq):
            note(scan.var, f"prefix scan of {scan.tensor}")
        for acc in accesses(eq.rhs):
            for target in written.get(acc.name, ()):
                if acc.indices != target.indices:
                    for index in acc.indices + target.indices:
                        for var in free_vars(index):
                            note(var, f"{acc.name} is read and written at different elements")
                    if any(not list(free_vars(i)) or list(accesses(i)) for i in acc.indices):
                        for loop in loops:
                            note(loop.var, f"{acc.name} is read at data-dependent or fixed elements")
    return {var: tuple(reasons) for var, reasons in carried.items()}


def loop_iterations(nests: tuple[Nest, ...]) -> int:
    """Sum over nests of the product of their loop extents (inner nests counted inside their parents):
    a rough cost, the same measure the reference corpus reports as `loop_iterations`."""

    def count(nest: Nest, outer: int) -> int:
        here = outer * math.prod(l.extent for l in nest.loops)
        inner = [s for s in nest.body if isinstance(s, Nest)]
        return (here if len(inner) < len(nest.body) else 0) + sum(count(s, here) for s in inner)

    return sum(count(n, 1) for n in nests)


def reduction_length(nests: tuple[Nest, ...]) -> int:
    """The largest number of terms any single reduction or scan of the program accumulates: what bounds
    the rounding error a reordering of the same arithmetic can cause (used by the verify tolerances)."""
    longest = 1
    for nest in nests:
        for loops, eq in equations(nest):
            red = reduction(loops, eq)
            if red is not None:
                longest = max(longest, math.prod(l.extent for l in loops if l.var in red.reduced_vars))
            for scan in scans(loops, eq):
                longest = max(longest, next(l.extent for l in loops if l.var == scan.var))
    return longest


def index_uses(nests: tuple[Nest, ...]) -> list[tuple[str, str, int, Expr, dict[str, int]]]:
    """Every use of a tensor as a subscript: (index tensor, indexed tensor, dimension, subscript expression,
    loop bounds there). Lets input generation keep index tensors inside the dimensions they index."""
    found = []
    for nest in nests:
        for loops, eq in equations(nest):
            bounds = {l.var: l.extent for l in loops}
            for acc in [eq.lhs, *accesses(eq.rhs)]:
                for dim, index in enumerate(acc.indices):
                    for inner in accesses(index):
                        found.append((inner.name, acc.name, dim, index, bounds))
    return found


def equality_uses(nests: tuple[Nest, ...]) -> list[tuple[str, tuple[int, int]]]:
    """Every test `T == e` (either side) of a plain tensor read against a loop-index expression `e`: (tensor,
    range of `e`). A one-hot selection compares an index tensor with a loop variable instead of subscripting
    with it (scatter_add's gather form); its values only matter, and PyTorch only accepts them, in that
    range."""
    found = []
    for nest in nests:
        for loops, eq in equations(nest):
            bounds = {l.var: l.extent for l in loops}
            for node in walk(eq.rhs):
                if type(node) is not Compare:
                    continue
                for (lhs, rhs), op in zip(zip(node.operands, node.operands[1:]), node.ops):
                    for tensor, other in ((lhs, rhs), (rhs, lhs)):
                        span = index_range(other, bounds) if op == "==" and type(tensor) is Access else None
                        if span is not None:
                            found.append((tensor.name, span))
    return found
