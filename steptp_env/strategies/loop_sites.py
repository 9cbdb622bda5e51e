"""Where the loop strategies act and the facts their explanations quote.

A loop strategy works on one *band* at a time: the loop tuple of a top-level nest or of an inner nest.
This module finds bands and action sites, reads action parameters, pairs the bands of two versions of a
nest (what `infer` compares) and words the facts about a loop (trip counts, strides, carried
dependences) that `loops` and `loop_kinds` put into their explanations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..errors import IllegalActionError, StepTPError
from ..ir.ast import (And, BinOp, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses, all_loops,
                      equations, map_children)
from ..ir.program import Program
from .base import Action
from .loop_deps import BandDependences, affine, band_dependences
from .util import nest_at


# -- sites ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """One loop tuple of a nest: where it is (`path` of body positions from the top-level nest), the loops
    around it and the nest that owns it."""

    path: tuple[int, ...]
    enclosing: tuple[Loop, ...]
    nest: Nest

    @property
    def vars(self) -> tuple[str, ...]:
        return self.nest.loop_vars

    def deps(self) -> BandDependences:
        return band_dependences(self.nest, self.enclosing)

    def position(self, var: str) -> int:
        return self.vars.index(var)


def bands(nest: Nest, path: tuple[int, ...] = (), enclosing: tuple[Loop, ...] = ()) -> Iterator[Band]:
    """Every band of a nest, outermost first."""
    yield Band(path, enclosing, nest)
    for i, stmt in enumerate(nest.body):
        if isinstance(stmt, Nest):
            yield from bands(stmt, path + (i,), enclosing + nest.loops)


def band_of(nest: Nest, var) -> Band:
    """The band that declares loop `var`; IllegalActionError when there is none."""
    for band in bands(nest):
        if var in band.vars:
            return band
    names = ", ".join(l.var for l in all_loops(nest))
    raise IllegalActionError(f"no loop {var!r} in this nest (loops: {names})")


def replace_band(nest: Nest, path: tuple[int, ...], new: Nest) -> Nest:
    """`nest` with the band at `path` replaced by `new`."""
    if not path:
        return new
    body = list(nest.body)
    body[path[0]] = replace_band(body[path[0]], path[1:], new)
    return replace(nest, body=tuple(body))


def with_nest(program: Program, index: int, nest: Nest) -> Program:
    """`program` with nest `index` replaced; IllegalActionError (naming the failed check) when the result is
    not a valid program."""
    nests = list(program.nests)
    nests[index] = nest
    try:
        return program.replace_nests(nests)
    except StepTPError as exc:  # a transformation must keep the program valid; say which check failed
        raise IllegalActionError(f"the result is not a valid program: {exc}") from None


def map_body(nest: Nest, fn: Callable[[Expr], Expr]) -> Nest:
    """`nest` with `fn` applied to both sides of every equation, inner nests included."""
    body = tuple(map_body(s, fn) if isinstance(s, Nest) else Equation(fn(s.lhs), fn(s.rhs)) for s in nest.body)
    return replace(nest, body=body)


def substitute(expr: Expr, var: str, value: Expr, parent: Expr | None = None) -> Expr:
    """`expr` with loop var `var` replaced by `value`, parenthesised like the reference does: bare as a whole
    subscript or call argument, in parentheses as an operand (`(j*257+c)+f`)."""
    if isinstance(expr, Var):
        if expr.name != var:
            return expr
        operand = isinstance(parent, (BinOp, Neg, Compare, And))
        return replace(value, parens=1) if operand and not isinstance(value, (Var, Const)) else value
    return map_children(expr, lambda child: substitute(child, var, value, expr))


def int_param(action: Action, name: str) -> int:
    """Action parameter `name`, which must be an integer."""
    value = action[name]
    if not isinstance(value, int):
        raise IllegalActionError(f"{action.strategy}: {name} must be an integer, got {value!r}")
    return value


def var_list(action: Action, name: str) -> tuple[str, ...]:
    """Action parameter `name`, which must be a tuple of loop names."""
    value = action[name]
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise IllegalActionError(f"{action.strategy}: {name} must be a list of loop names, got {value!r}")
    return value


def loop_site(program: Program, action: Action) -> tuple[int, Nest, Band, Loop]:
    """Where an action with `nest` and `loop` parameters acts: nest index, nest, band and loop."""
    index = action["nest"]
    nest = nest_at(program, index)
    band = band_of(nest, action["loop"])
    return index, nest, band, band.nest.loop(action["loop"])


def changed_nest(before: Program, after: Program) -> tuple[int, Nest, Nest] | None:
    """The only nest that differs between two programs with the same number of nests."""
    if len(before.nests) != len(after.nests):
        return None
    changed = [i for i, (b, a) in enumerate(zip(before.nests, after.nests)) if b != a]
    return (changed[0], before.nests[changed[0]], after.nests[changed[0]]) if len(changed) == 1 else None


def band_pairs(before: Nest, after: Nest) -> Iterator[tuple[Band, Band]]:
    """Bands at the same path in two versions of a nest."""
    found = {b.path: b for b in bands(after)}
    for band in bands(before):
        if band.path in found:
            yield band, found[band.path]


def first_difference(a: tuple[Loop, ...], b: tuple[Loop, ...]) -> int:
    """Position of the first loop where two loop tuples differ (the shorter length when one extends the
    other)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# -- facts used in explanations -----------------------------------------------------------------------


def trip_count(loops: tuple[Loop, ...], vector_once: bool = False) -> int:
    """Iterations of a loop tuple (with `vector_once`, a vectorized loop counts as one)."""
    return math.prod(1 if vector_once and l.kind == "V" else l.extent for l in loops)


def inner_trip(band: Band, var: str, vector_once: bool = False) -> int:
    """Iterations of everything a loop runs per iteration: the band loops inside it and the largest
    inner nest (with `vector_once`, a vectorized loop counts as one iteration)."""
    inside = trip_count(band.nest.loops[band.position(var) + 1:], vector_once)
    inner = [b for b in bands(band.nest) if b.path]
    return inside * max((trip_count(b.enclosing[len(band.nest.loops):] + b.nest.loops, vector_once) for b in inner),
                        default=1)


def strides(nest: Nest, var: str) -> tuple[list[str], list[str], list[str]]:
    """Tensors whose accesses move by one element per iteration of `var` (last subscript has coefficient 1
    and no other subscript mentions it), those it moves along another way, and those it does not touch
    (reused across its iterations)."""
    unit: dict[str, None] = {}
    other: dict[str, None] = {}
    reused: dict[str, None] = {}
    for _, eq in equations(nest):
        for acc in [eq.lhs, *accesses(eq.rhs)]:
            forms = [affine(i) for i in acc.indices]
            coeffs = [None if f is None else f[0].get(var, 0) for f in forms]
            if all(c == 0 for c in coeffs):
                reused.setdefault(acc.name, None)
            elif coeffs[-1] == 1 and all(c == 0 for c in coeffs[:-1]):
                unit.setdefault(acc.name, None)
            else:
                other.setdefault(acc.name, None)
    return list(unit), [n for n in other if n not in unit], [n for n in reused if n not in unit and n not in other]


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: "3 inner iterations"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def listed(names) -> str:
    """Names joined for a sentence: "A, B and C"."""
    names = list(names)
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def access_pattern(nest: Nest, var: str, step: str = "consecutive iterations") -> str:
    """How the accesses move along loop `var`, in words: contiguous, strided, reused."""
    unit, strided, reused = strides(nest, var)
    parts = []
    if unit:
        parts.append(f"{step} of {var} touch adjacent elements of {listed(unit)}")
    if strided:
        parts.append(f"they jump through {listed(strided)} with a larger stride")
    if reused:
        parts.append(f"they reuse the same element of {listed(reused)}")
    return "; ".join(parts) if parts else f"{var} indexes no tensor directly"


def legal_fact(band: Band, var: str) -> str:
    """Why running the iterations of loop `var` in any order is legal, or which dependences it carries."""
    deps = band.deps()
    if deps.parallel(var):
        return f"no dependence is carried by loop {var}: every iteration touches its own elements"
    return f"loop {var} carries: " + "; ".join(deps.reasons(var))
