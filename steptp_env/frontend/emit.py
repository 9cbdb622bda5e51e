"""Building LEIR programs one primitive at a time: names, loops, broadcasting reads, maps and reductions.

Op handlers never write LEIR text; they describe each output element as an expression of loop vars
through `Builder.map`, `Builder.reduce` and `Builder.read`, and the builder names tensors and loop vars in
the Step-TP conventions (tensors `A C D E ... Z Aa Ac ...` never L P V B U T; loop vars `a c d f g h ...`
restarting in every nest).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir.ast import Access, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var
from ..ir.dtypes import DTYPE_TO_CODE
from ..ir.program import Program, Signature, TensorSpec

_LETTERS = [c for c in "ACDEFGHIJKMNOQRSWXYZ"]
_VAR_LETTERS = [c for c in "acdfghijkmnoqrswxyz"]


def _tensor_names():
    yield from _LETTERS
    for first, second in itertools.product(_LETTERS, "abcdefghijkmnoqrswxyz"):
        yield first + second


def loop_var_names(count: int) -> list[str]:
    """Loop variable names for a nest of `count` loops: a c d f g h ..., then a0 a1 ... past the letters."""
    names = _VAR_LETTERS[:count]
    return names + [f"a{i}" for i in range(count - len(names))]


@dataclass(frozen=True)
class Value:
    """A tensor of the program being built."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)


Index = Sequence[Expr]
ElementFn = Callable[[list[Var]], Expr]


def const(value: int | float) -> Expr:
    """A literal; negative values become a unary minus so that printing and parsing agree."""
    if isinstance(value, float) and value != value:
        raise ValueError("NaN has no LEIR literal")
    if value < 0:
        return Neg(const(-value))
    if isinstance(value, float):
        return Const(value, "inf" if value == float("inf") else repr(value))
    return Const(int(value), str(int(value)))


def add(a: Expr, b: Expr) -> Expr:
    return BinOp("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return BinOp("-", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    return BinOp("*", a, b)


def div(a: Expr, b: Expr) -> Expr:
    return BinOp("/", a, b)


def call(func: str, *args: Expr) -> Expr:
    return Call(func, tuple(args))


def cmp(a: Expr, op: str, b: Expr) -> Expr:
    return Compare((a, b), (op,))


def select(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Call("if_then_else", (cond, a, b))


class Builder:
    """Accumulates nests and the signature of one program."""

    def __init__(self) -> None:
        self.nests: list[Nest] = []
        self.specs: list[TensorSpec] = []
        self._names = _tensor_names()
        self._reserved: set[str] = set()

    # -- tensors -------------------------------------------------------------------------------------
    def fresh_name(self) -> str:
        return next(self._names)

    def input(self, shape: Sequence[int], dtype: str, role: str = "input") -> Value:
        """A tensor the caller provides (role `input` or `param`)."""
        value = Value(self.fresh_name(), tuple(int(d) for d in shape), dtype)
        self.specs.append(TensorSpec(value.name, value.shape, dtype, role))
        return value

    def new(self, shape: Sequence[int], dtype: str) -> Value:
        return Value(self.fresh_name(), tuple(int(d) for d in shape), dtype)

    def access(self, value: Value, index: Index) -> Access:
        if len(index) != value.rank:
            raise ValueError(f"{value.name} has rank {value.rank}, got {len(index)} subscripts")
        return Access(value.name, value.dtype, "g", tuple(index))

    def read(self, value: Value, index: Index) -> Access:
        """Read `value` at the trailing dims of `index`, broadcasting size-1 dims (NumPy rules)."""
        index = list(index)[len(index) - value.rank:] if value.rank else []
        return self.access(value, [const(0) if d == 1 else i for d, i in zip(value.shape, index)])

    # -- nests ---------------------------------------------------------------------------------------
    def emit(self, extents: Sequence[int], body: Callable[[list[Var]], list[Equation]]) -> None:
        """One nest over `extents`; `body` gets the loop vars and returns the equations."""
        names = loop_var_names(len(extents))
        loops = tuple(Loop("L", int(e), n) for e, n in zip(extents, names))
        variables = [Var(n) for n in names]
        self.nests.append(Nest(loops, tuple(body(variables))))

    def map(self, shape: Sequence[int], dtype: str, fn: ElementFn) -> Value:
        """out[i...] = fn(i...) over `shape`."""
        out = self.new(shape, dtype)
        self.emit(out.shape, lambda v: [Equation(self.access(out, v), fn(v))])
        return out

    def reduce(self, shape: Sequence[int], extents: Sequence[int], dtype: str, op: str,
               fn: Callable[[list[Var], list[Var]], Expr]) -> Value:
        """out[i...] = op over j... of fn(i..., j...): `op` is + * max min; loops: out dims, then reduced."""
        out = self.new(shape, dtype)
        rank = len(out.shape)

        def body(v: list[Var]) -> list[Equation]:
            target = self.access(out, v[:rank])
            term = fn(v[:rank], v[rank:])
            rhs = call(op, target, term) if op in ("max", "min") else BinOp(op, target, term)
            return [Equation(target, rhs)]

        self.emit([*out.shape, *extents], body)
        return out

    def program(self, outputs: Sequence[Value]) -> Program:
        """Finish: the outputs become signature tensors (copied out when an output is also an input or
        appears twice)."""
        seen: set[str] = set()
        specs = list(self.specs)
        inputs = {s.name for s in specs}
        for value in outputs:
            if value.name in inputs or value.name in seen:
                value = self.map(value.shape, value.dtype, lambda v, src=value: self.access(src, v))
            seen.add(value.name)
            specs.append(TensorSpec(value.name, value.shape, value.dtype, "output"))
        return Program(tuple(self.nests), Signature(tuple(specs)))


def dtype_code(dtype: str) -> str:
    return DTYPE_TO_CODE[dtype]
