"""One row of loop-structure features per LEIR equation: what a schedule changes and TVM's per-store rows
show only indirectly.

A row describes the loops around the equation from the innermost outwards (extent, kind, whether the loop
is reduced over) and each tensor access (lhs first, then up to `ACCESS_SLOTS - 1` distinct reads): its
stride in elements along the three innermost loops and the bytes it touches over one iteration of each of
the `LEVELS` innermost loop levels, so two loop orders of the same tiling, a local accumulator or a blocked
layout give different rows. Pooling such rows loses exactly that (the previous model's 27 pairs of equal
vectors 1.7x apart), so the cost model keeps them per row and sums per-row predictions.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.analysis import index_range, reduction
from ..ir.ast import Access, BinOp, Call, Compare, Const, Equation, Loop, Neg, Var, accesses, equations, walk
from ..ir.dtypes import dtype_bytes
from ..ir.program import Program, TensorInfo

LOOP_SLOTS = 5
ACCESS_SLOTS = 4
STRIDE_LOOPS = 3
LEVELS = 4
KINDS = "LPVUB"
TRANSCENDENTAL = ("exp", "log", "sqrt", "erf")

_LOOP_WIDTH = 2 + len(KINDS)  # log2 extent, reduced, kind one-hot
_ACCESS_WIDTH = STRIDE_LOOPS + LEVELS + 2  # strides, footprints, local scope, present
EQUATION_FEATURES = ("log2_trips", "depth", "reduction", "log2_reduction_length", "innermost_reduced_depth",
                     "arith_ops", "transcendental", "conditions", "divisions", "is_copy", "log2_parallel_trips",
                     "innermost_vector_lanes", "log2_unrolled", "position_in_nest", "equations_in_nest",
                     "log2_program_trips")
ROW_SIZE = LOOP_SLOTS * _LOOP_WIDTH + ACCESS_SLOTS * _ACCESS_WIDTH + LEVELS + len(EQUATION_FEATURES)


def _log2(x: float) -> float:
    return math.log2(1 + abs(x))


def _value(expr, at: dict[str, int]) -> int | None:
    """An integer subscript evaluated at one point of the loop vars; None where it reads data or a float."""
    if isinstance(expr, Var):
        return at.get(expr.name, 0)
    if isinstance(expr, Const):
        return expr.value if expr.is_int else None
    if isinstance(expr, Neg):
        inner = _value(expr.operand, at)
        return None if inner is None else -inner
    if isinstance(expr, BinOp) and expr.op in ("+", "-", "*", "//", "%"):
        lhs, rhs = _value(expr.lhs, at), _value(expr.rhs, at)
        if lhs is None or rhs is None or (expr.op in ("//", "%") and rhs == 0):
            return None
        if expr.op == "//":
            return lhs // rhs
        if expr.op == "%":
            return lhs % rhs
        return lhs + rhs if expr.op == "+" else lhs - rhs if expr.op == "-" else lhs * rhs
    return None


def _address(access: Access, shape: tuple[int, ...], at: dict[str, int]) -> int | None:
    """Row-major element offset of `access` at one point (the tensor's shape as the analysis infers it)."""
    offset = 0
    for index, extent in zip(access.indices, shape):
        value = _value(index, at)
        if value is None:
            return None
        offset = offset * extent + value
    return offset


def _stride(access: Access, shape: tuple[int, ...], var: str) -> float:
    """Elements between the accesses of two consecutive iterations of `var` (others at 0); -1 if unknown."""
    base, step = _address(access, shape, {}), _address(access, shape, {var: 1})
    return -1.0 if base is None or step is None else float(abs(step - base))


def _footprint(access: Access, loops: tuple[Loop, ...], inner: int, width: int) -> float:
    """Bytes `access` spans over one iteration of its `inner` innermost loops (a bounding box)."""
    bounds = {l.var: l.extent if k >= len(loops) - inner else 1 for k, l in enumerate(loops)}
    size = 1
    for index in access.indices:
        span = index_range(index, bounds)
        if span is None:
            return -1.0
        size *= span[1] - span[0] + 1
    return float(size * width)


def _distinct_accesses(eq: Equation) -> list[Access]:
    found = [eq.lhs]
    for acc in accesses(eq.rhs):
        if acc not in found:
            found.append(acc)
    return found[:ACCESS_SLOTS]


def equation_row(loops: tuple[Loop, ...], eq: Equation, tensors: dict[str, TensorInfo], position: int,
                 in_nest: int, program_trips: int) -> np.ndarray:
    """The feature row of one equation inside `loops` (outermost first)."""
    red = reduction(loops, eq)
    reduced = set(red.reduced_vars) if red else set()
    inner_first = loops[::-1]
    row: list[float] = []
    for slot in range(LOOP_SLOTS):
        if slot < len(inner_first):
            loop = inner_first[slot]
            row += [_log2(loop.extent), float(loop.var in reduced)] + [float(loop.kind == k) for k in KINDS]
        else:
            row += [0.0] * _LOOP_WIDTH
    totals = [0.0] * LEVELS
    listed = _distinct_accesses(eq)
    for slot in range(ACCESS_SLOTS):
        if slot >= len(listed):
            row += [0.0] * _ACCESS_WIDTH
            continue
        access = listed[slot]
        tensor = tensors.get(access.name)
        shape = tensor.shape if tensor is not None else tuple(1 for _ in access.indices)
        strides = [_stride(access, shape, l.var) if k < len(inner_first) else 0.0
                   for k, l in zip(range(STRIDE_LOOPS), inner_first)]
        strides += [0.0] * (STRIDE_LOOPS - len(strides))
        prints = [_footprint(access, loops, level + 1, 1 if tensor is None else dtype_bytes(tensor.dtype)) for level in range(LEVELS)]
        for level, size in enumerate(prints):
            totals[level] += max(size, 0.0)
        row += [_log2(s) if s >= 0 else -1.0 for s in strides] + [_log2(p) if p >= 0 else -1.0 for p in prints]
        row += [float(access.scope == "l"), 1.0]
    row += [_log2(t) for t in totals]
    nodes = list(walk(eq.rhs))
    trips = math.prod(l.extent for l in loops)
    reduced_depths = [k for k, l in enumerate(inner_first) if l.var in reduced]
    vector = inner_first[0].extent if inner_first and inner_first[0].kind == "V" else 0
    row += [_log2(trips), float(len(loops)), float(red is not None),
            _log2(math.prod(l.extent for l in loops if l.var in reduced)) if reduced else 0.0,
            float(reduced_depths[0]) if reduced_depths else -1.0,
            float(sum(isinstance(n, (BinOp, Call, Neg)) for n in nodes)),
            float(sum(isinstance(n, Call) and n.func in TRANSCENDENTAL for n in nodes)),
            float(sum(isinstance(n, Compare) or (isinstance(n, Call) and n.func == "if_then_else") for n in nodes)),
            float(sum(isinstance(n, BinOp) and n.op in ("/", "//", "%") for n in nodes)),
            float(isinstance(eq.rhs, Access)),
            _log2(math.prod(l.extent for l in loops if l.kind == "P")), float(vector),
            _log2(math.prod(l.extent for l in loops if l.kind == "U")), float(position), float(in_nest),
            _log2(program_trips)]
    return np.asarray(row, np.float32)


def equation_rows(program: Program) -> np.ndarray:
    """One `equation_row` per equation of the program, in execution order: shape (equations, ROW_SIZE)."""
    tensors = program.tensors
    listed = [(n, loops, eq) for n, nest in enumerate(program.nests) for loops, eq in equations(nest)]
    program_trips = sum(math.prod(l.extent for l in loops) for _, loops, _ in listed)
    per_nest: dict[int, int] = {}
    for n, _, _ in listed:
        per_nest[n] = per_nest.get(n, 0) + 1
    rows, seen = [], {}
    for n, loops, eq in listed:
        position = seen.get(n, 0)
        seen[n] = position + 1
        rows.append(equation_row(loops, eq, tensors, position, per_nest[n], program_trips))
    return np.stack(rows) if rows else np.zeros((0, ROW_SIZE), np.float32)
