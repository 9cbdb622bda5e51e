"""Zero padding: a copied tensor stored larger than the part read, and the sum reductions that can then run
over the padded extent.

A loop of extent 37 or 197 has no factor a tile or a vector loop can use. Stored with its reduced
dimension padded to 40 or 208 with zeros (`layout_transformation` with a `[k,pad,P]` group), a tensor can
be read past the old extent; once every tensor a sum reduction reads along that loop is so padded, the
loop itself can run to P: the added iterations add products of zeros, so every partial sum is unchanged,
bit for bit. Only sums whose added terms are exactly +0 are extended: the body must vanish when the padded
reads are zero, without multiplying a zero by anything that could be inf or NaN (so `A*B` with both padded
qualifies, `A*B` with B unpadded or `(A-m)*(A-m)` does not). Output loops (whose variable indexes the
written tensor) never grow: the result would need a padded output and a crop.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..frontend.emit import cmp, select
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                      equations, free_vars)
from ..ir.program import Program
from .graph_util import range_chains

PAD_MULTIPLES = (16, 8)
"""The menu pads a dimension to the next multiple of 16 (an AVX-512 register of float32), or of 8 (AVX2),
the first that adds at most `PAD_OVERHEAD` of the extent."""

PAD_OVERHEAD = 0.25


def pad_extent(extent: int) -> int | None:
    """The padded extent the menu offers for a dimension of `extent`, or None (a multiple of 16 already, at
    most 8, or too costly to pad)."""
    if extent <= min(PAD_MULTIPLES) or extent % max(PAD_MULTIPLES) == 0:
        return None
    for multiple in PAD_MULTIPLES:
        padded = math.ceil(extent / multiple) * multiple
        if padded != extent and padded - extent <= PAD_OVERHEAD * extent:
            return padded
    return None


def pad_fill(read: Expr, guards: list[tuple[str, int]]) -> Expr:
    """The value a padded copy stores: `read` where every guarded variable is below its old extent, else 0."""
    conditions = [cmp(Var(var), "<", Const(extent)) for var, extent in guards]
    condition = conditions[0]
    for extra in conditions[1:]:
        condition = And(condition, extra)
    return select(condition, read, Const(0))


def padding_zeros(program: Program, tensors) -> dict[str, tuple[int | None, ...]]:
    """For each of `tensors`, per dimension, the index from which it holds zeros up to its extent, when one
    equation of the program writes it and that equation is a padded copy's
    (`T_{..,v,..} = if_then_else(... & v<m & ..., x, 0)`, v a plain loop variable at that dimension): m;
    None where the program does not show such zeros. One pass over the program for all of them."""
    wanted = set(tensors)
    writers: dict[str, list[Equation]] = {}
    for nest in program.nests:
        for _, eq in equations(nest):
            if eq.lhs.name in wanted:
                writers.setdefault(eq.lhs.name, []).append(eq)
    found = {}
    for name in wanted:
        eqs = writers.get(name, [])
        rank = len(program.tensors[name].shape) if name in program.tensors else 0
        found[name] = tuple(_zero_start(eqs[0], dim) if len(eqs) == 1 else None for dim in range(rank))
    return found


def zero_from(program: Program, tensor: str, dim: int) -> int | None:
    """`padding_zeros` of one tensor at one dimension."""
    starts = padding_zeros(program, [tensor])[tensor]
    return starts[dim] if dim < len(starts) else None


def _zero_start(eq: Equation, dim: int) -> int | None:
    """m when `eq` stores zeros from index m on along `dim` (see `padding_zeros`), else None."""
    var = eq.lhs.indices[dim] if dim < eq.lhs.rank else None
    rhs = eq.rhs
    if not (isinstance(var, Var) and isinstance(rhs, Call) and rhs.func == "if_then_else"
            and rhs.args[2] == Const(0)):
        return None
    bounds = [b for b in (_upper_bound(c, var.name) for c in range_chains(rhs.args[0], var.name)) if b is not None]
    return min(bounds) if bounds else None


def _upper_bound(condition: Compare, var: str) -> int | None:
    """m when the comparison chain `condition` requires `var < m` (m an integer constant)."""
    for (lhs, rhs), op in zip(zip(condition.operands, condition.operands[1:]), condition.ops):
        if op == "<" and lhs == Var(var) and isinstance(rhs, Const) and rhs.is_int:
            return rhs.value
    return None


def extend_reduction(program: Program, nest: Nest, var: str, extent: int, padded: int) -> Nest | None:
    """`nest` with its loop `var` (of `extent`) run to `padded`, when that keeps every value it computes:
    each equation under the loop is a sum reduction over `var` (`D = D + body`, `var` not in D's
    subscripts) whose body vanishes exactly when the reads along `var` are zero, and every tensor read
    along `var` holds zeros from `extent` or earlier to at least `padded` (`zero_from`, with the tensor's
    shape). None otherwise."""
    under = [eq for loops, eq in equations(nest) if any(l.var == var and l.extent == extent for l in loops)]
    if not under or any(not _sum_vanishes(program, eq, var, extent, padded) for eq in under):
        return None
    return _with_extent(nest, var, extent, padded)


def _sum_vanishes(program: Program, eq: Equation, var: str, extent: int, padded: int) -> bool:
    target, rhs = eq.lhs, eq.rhs
    if any(var in free_vars(i) for i in target.indices) or not (isinstance(rhs, BinOp) and rhs.op == "+"):
        return False
    body = rhs.rhs if rhs.lhs == target else rhs.lhs if rhs.rhs == target else None
    return body is not None and _vanishes(program, body, var, extent, padded)


def _vanishes(program: Program, expr: Expr, var: str, extent: int, padded: int) -> bool:
    """Whether `expr` is exactly +0 or -0 at `var` in [extent, padded), built only from padded reads along
    `var` (zeros there), finite constants, sums, differences, negations and products whose every factor
    vanishes or is a finite constant (0 times an unknown value could be NaN)."""
    if isinstance(expr, BinOp) and expr.op == "*":
        sides = (expr.lhs, expr.rhs)
        zero = [_vanishes(program, s, var, extent, padded) for s in sides]
        return any(zero) and all(z or _finite_constant(s) for z, s in zip(zero, sides))
    if isinstance(expr, BinOp) and expr.op in ("+", "-"):
        return all(_vanishes(program, s, var, extent, padded) for s in (expr.lhs, expr.rhs))
    if isinstance(expr, BinOp) and expr.op == "/":
        return _vanishes(program, expr.lhs, var, extent, padded) and _finite_constant(expr.rhs) \
            and expr.rhs.value != 0
    if isinstance(expr, Neg):
        return _vanishes(program, expr.operand, var, extent, padded)
    if isinstance(expr, Access):
        return _zero_read(program, expr, var, extent, padded)
    return False


def _zero_read(program: Program, access: Access, var: str, extent: int, padded: int) -> bool:
    """A read whose only use of `var` is a plain subscript into a dimension padded with zeros."""
    if any(True for i in access.indices for _ in accesses(i)):
        return False
    dims = [d for d, index in enumerate(access.indices) if var in free_vars(index)]
    if len(dims) != 1 or access.indices[dims[0]] != Var(var):
        return False
    start = zero_from(program, access.name, dims[0])
    return start is not None and start <= extent and program.tensors[access.name].shape[dims[0]] >= padded


def _finite_constant(expr: Expr) -> bool:
    return isinstance(expr, Const) and math.isfinite(expr.value)


def _with_extent(nest: Nest, var: str, extent: int, padded: int) -> Nest:
    def grow(loop: Loop) -> Loop:
        return replace(loop, extent=padded) if loop.var == var and loop.extent == extent else loop

    body = tuple(_with_extent(s, var, extent, padded) if isinstance(s, Nest) else s for s in nest.body)
    return replace(nest, loops=tuple(grow(l) for l in nest.loops), body=body)
