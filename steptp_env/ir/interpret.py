"""A slow, independent NumPy interpreter of LEIR, written straight from the semantics in docs/leir.md.

It exists so that tests have a second semantics to check the TVM lowering against, construct by construct.
It walks the loops with Python, evaluates every expression element by element on NumPy scalars and stores
each value as it goes, so it is meant for small shapes only (up to about 1e5 loop iterations).

Values are NumPy scalars (typed) or Python numbers (literals, and subexpressions made only of literals).
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .analysis import REDUCE_OPS, accumulation, reduction, reduction_identity
from .ast import Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var
from .dtypes import is_float
from .program import Program

_PYTHON_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
               "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "max": max, "min": min,
               "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
               "!=": operator.ne}
_NUMPY_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
              "%": np.remainder, "**": np.power, "max": np.maximum, "min": np.minimum, "<": np.less,
              "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}
_MATH = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt}


def interpret(program: Program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `program` on `inputs` (every signature tensor whose role is not "output", by name); return every
    output tensor by name, with its signature shape and dtype."""
    arrays = {}
    for name, info in program.tensors.items():
        dtype = _np_dtype(info.dtype)
        if info.role in ("input", "param"):
            if name not in inputs:
                raise ValueError(f"no value given for {info.role} {name}")
            arrays[name] = np.array(inputs[name], dtype=dtype)
            if arrays[name].shape != info.shape:
                raise ValueError(f"{name} has shape {arrays[name].shape}, the signature says {info.shape}")
        else:
            arrays[name] = np.full(info.shape, np.nan if is_float(info.dtype) else 0, dtype=dtype)
    written: set[str] = set()
    plans = [_plan(nest, (), written) for nest in program.nests]
    machine = _Machine(arrays)
    with np.errstate(all="ignore"):
        for loops, body in plans:
            machine.run(loops, body)
    return {spec.name: arrays[spec.name] for spec in program.signature.outputs}


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # NumPy has no bfloat16; TVM depends on ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _cast(value: Any, dtype: np.dtype) -> np.generic:
    """Convert like a store: float to int truncates toward zero."""
    return np.asarray(value).astype(dtype)[()]


@dataclass
class _Step:
    """An equation ready to run: how it starts, the identity of its top-level operator, the float type that
    integer divisions and float literals next to integers take, and the elements a reduction has started."""

    eq: Equation
    is_reduction: bool
    is_fresh: bool
    identity: int | float
    float_type: np.dtype
    started: set[tuple[int, ...]] = field(default_factory=set)


def _plan(nest: Nest, outer: tuple[Loop, ...], written: set[str]) -> tuple[tuple[Loop, ...], list]:
    """The nest's own loops and its body, equations turned into `_Step`s (`written`: tensors that earlier
    statements of the program write, in program order)."""
    loops, body = outer + nest.loops, []
    for stmt in nest.body:
        if isinstance(stmt, Nest):
            body.append(_plan(stmt, loops, written))
            continue
        target, rhs = stmt.lhs, stmt.rhs
        top = rhs.op if isinstance(rhs, BinOp) else rhs.func if isinstance(rhs, Call) else None
        identity = reduction_identity(top if top in REDUCE_OPS else "+", target.dtype)
        is_reduction = reduction(loops, stmt) is not None
        is_fresh = not is_reduction and accumulation(stmt) is not None and target.name not in written
        float_type = _np_dtype(target.dtype if is_float(target.dtype) else "float64")
        body.append(_Step(stmt, is_reduction, is_fresh, identity, float_type))
        written.add(target.name)
    return nest.loops, body


class _Machine:
    """Runs planned nests on `arrays`; `env` maps loop vars to their values, `step` is the equation running
    and `from_identity` says whether its read of its own target element yields the identity."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.env: dict[str, np.int64] = {}
        self.step: _Step | None = None
        self.from_identity = False

    def run(self, loops: tuple[Loop, ...], body: list) -> None:
        for values in itertools.product(*(range(loop.extent) for loop in loops)):
            self.env.update((loop.var, np.int64(v)) for loop, v in zip(loops, values))
            for stmt in body:
                if isinstance(stmt, _Step):
                    self.execute(stmt)
                else:
                    self.run(*stmt)

    def execute(self, step: _Step) -> None:
        self.step = step
        target = step.eq.lhs
        array = self.arrays[target.name]
        idx = self.element(target)
        if not self.in_bounds(idx, array):
            raise IndexError(f"write to {target.name}{list(idx)} is outside its shape {array.shape}")
        self.from_identity = step.is_fresh or (step.is_reduction and idx not in step.started)
        if step.is_reduction:
            step.started.add(idx)
        array[idx] = _cast(self.eval(step.eq.rhs), array.dtype)

    def element(self, acc: Access) -> tuple[int, ...]:
        return tuple(operator.index(self.eval(index)) for index in acc.indices)

    @staticmethod
    def in_bounds(idx: tuple[int, ...], array: np.ndarray) -> bool:
        return all(0 <= i < n for i, n in zip(idx, array.shape))

    def read(self, acc: Access) -> np.generic:
        step, array = self.step, self.arrays[acc.name]
        if self.from_identity and acc == step.eq.lhs:
            return _cast(step.identity, _np_dtype(acc.dtype))
        idx = self.element(acc)
        if not self.in_bounds(idx, array):
            if acc.name != step.eq.lhs.name:
                raise IndexError(f"read of {acc.name}{list(idx)} is outside its shape {array.shape}")
            value = _cast(step.identity, array.dtype)  # a scan reading before its first element
        else:
            value = array[idx]
        return value if acc.dtype == array.dtype.name else _cast(value, _np_dtype(acc.dtype))

    def eval(self, e: Expr) -> Any:
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Var):
            return self.env[e.name]
        if isinstance(e, Access):
            return self.read(e)
        if isinstance(e, Neg):
            value = _arith(self.eval(e.operand))
            return np.negative(value) if isinstance(value, np.generic) else -value
        if isinstance(e, BinOp):
            return self.binary(e.op, self.eval(e.lhs), self.eval(e.rhs))
        if isinstance(e, Compare):
            values = [self.eval(operand) for operand in e.operands]
            return all(bool(self.binary(op, a, b)) for op, a, b in zip(e.ops, values, values[1:]))
        if isinstance(e, And):  # both sides are evaluated: only if_then_else skips what it does not choose
            return bool(self.eval(e.lhs)) & bool(self.eval(e.rhs))
        if e.func == "if_then_else":
            return self.eval(e.args[1] if self.eval(e.args[0]) else e.args[2])
        if e.func in ("max", "min"):
            return self.binary(e.func, self.eval(e.args[0]), self.eval(e.args[1]))
        return self.function(e.func, _arith(self.eval(e.args[0])))

    def binary(self, op: str, a: Any, b: Any) -> Any:
        """NumPy on the promoted type: floats win (the wider one), an integer division or a float literal
        next to integers takes the equation's float type, literals take the other operand's type."""
        a, b = _arith(a), _arith(b)
        typed = [v.dtype for v in (a, b) if isinstance(v, np.generic)]
        if not typed:
            return _PYTHON_OPS[op](a, b)
        floats = [t for t in typed if is_float(t.name)]
        if floats:
            dtype = functools.reduce(np.promote_types, floats)
        elif op == "/" or isinstance(a, float) or isinstance(b, float):
            dtype = self.step.float_type
        else:
            dtype = functools.reduce(np.promote_types, typed)
        return _NUMPY_OPS[op](dtype.type(a), dtype.type(b))

    def function(self, func: str, x: Any) -> Any:
        if func == "abs":
            return np.abs(x) if isinstance(x, np.generic) else abs(x)
        if not isinstance(x, np.generic):  # only literals: double precision, then a literal again
            return float(_MATH[func](np.float64(x))) if func in _MATH else math.erf(x)
        dtype = x.dtype if is_float(x.dtype.name) else self.step.float_type
        if func == "erf":
            return dtype.type(math.erf(float(x)))
        return _MATH[func](dtype.type(x))


def _arith(value: Any) -> Any:
    """A bool in arithmetic is the integer 0 or 1 (typed like a literal, so it takes the other operand's type)."""
    return int(value) if isinstance(value, (bool, np.bool_)) else value
