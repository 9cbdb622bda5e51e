"""Seeded random inputs for a program, with index tensors kept inside the dimensions they index."""
from __future__ import annotations

import numpy as np

from ..ir.analysis import equality_uses, index_range, index_uses
from ..ir.ast import Const, Expr, replace_accesses
from ..ir.dtypes import is_float, is_int
from ..ir.program import Program


def index_bounds(program: Program) -> dict[str, tuple[int, int]]:
    """Input tensor -> [lo, hi] its values must stay in so that every subscript it takes part in stays
    inside the indexed dimension. A subscript is taken to be affine in the index value (`T`, `T+2`,
    `4-T`, `2*T+c`), which covers gathers and precomputed indices. An integer input tested for equality
    with a loop index (`T == c`, a one-hot selection) stays in that index's range."""
    known = program.tensors
    bounds: dict[str, tuple[int, int]] = {}
    for name, indexed, dim, expr, loops in index_uses(program.nests):
        spec = known.get(name)
        if spec is None or spec.role == "intermediate":
            continue
        at0 = index_range(_substitute(expr, name, 0), loops)
        at1 = index_range(_substitute(expr, name, 1), loops)
        if at0 is None or at1 is None or at1[0] - at0[0] == 0:
            continue
        # subscript = rest + step * value with rest in at0; keep it inside [0, last]
        step, last = at1[0] - at0[0], known[indexed].shape[dim] - 1
        if step > 0:
            lo, hi = -(at0[0] // step), (last - at0[1]) // step
        else:
            lo, hi = -((last - at0[1]) // -step), at0[0] // -step
        _narrow(bounds, name, lo, hi)
    for name, (lo, hi) in equality_uses(program.nests):
        if name in known and known[name].role != "intermediate" and is_int(known[name].dtype):
            _narrow(bounds, name, lo, hi)
    return bounds


def _narrow(bounds: dict[str, tuple[int, int]], name: str, lo: int, hi: int) -> None:
    old = bounds.get(name, (lo, hi))
    bounds[name] = (max(old[0], lo), min(old[1], hi))


def _substitute(expr: Expr, name: str, value: int) -> Expr:
    return replace_accesses(expr, lambda acc: Const(value, str(value)) if acc.name == name else acc)


def random_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Floats uniform in [-1, 1), bools fair coins, index tensors uniform inside their bounds, other
    integers in [0, 8). The same seed gives the same arrays."""
    rng = np.random.default_rng(seed)
    limits = index_bounds(program)
    arrays = {}
    for spec in program.signature.inputs:
        if is_float(spec.dtype):
            arrays[spec.name] = np.asarray(rng.uniform(-1.0, 1.0, spec.shape), dtype=spec.dtype)
        elif spec.dtype == "bool":
            arrays[spec.name] = np.asarray(rng.random(spec.shape) < 0.5)
        elif is_int(spec.dtype):
            lo, hi = limits.get(spec.name, (0, 7))
            arrays[spec.name] = np.asarray(rng.integers(lo, max(lo, hi) + 1, spec.shape), dtype=spec.dtype)
        else:
            raise ValueError(f"no input generator for dtype {spec.dtype}")
    return arrays
