"""common_subexpression_elimination and dead_code_elimination: work done twice computed once into a new nest,
and a nest whose results nobody reads deleted. Both leave every output's value as it was (the subexpression
is evaluated in the same precision, only where it is safe at every iteration).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import users, writes
from ..ir.ast import Access, Equation, Expr, Nest, Var
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (Path, bounds_of, compute_nest, flat_equations, hoist_problem, is_compound, node_at, replace_at,
                         safe_everywhere, storable, trip_count, under_branch, value_accesses, value_paths,
                         vars_in_loop_order)
from .util import fresh_tensor, holds, int_param, is_intermediate, nest_at


# -- common_subexpression_elimination --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Common:
    """A repeated sub-expression of a run of nests with the same loops, and where it occurs."""

    expr: Expr
    dtype: str
    start: int
    occurrences: tuple[tuple[int, int, Path], ...]  # (nest, equation, path)

    @property
    def end(self) -> int:
        return max(n for n, _, _ in self.occurrences)


def _occurrences(nest: Nest, eq: Equation, node: Expr) -> list[Path]:
    """Paths of the outermost occurrences of `node` among `eq`'s values that may read a stored copy."""
    found: list[Path] = []
    if not storable(node, eq, nest):
        return found
    for path in value_paths(eq.rhs):
        if not any(path[:len(p)] == p for p in found) and node_at(eq.rhs, path) == node:
            found.append(path)
    return found


def _common_at(program: Program, start: int) -> _Common | None:
    """The first sub-expression (equation order, then pre-order) of nest `start` that occurs at least twice in
    the run of nests after it with the same loops, and can be computed once before the run."""
    nest = program.nests[start]
    eqs = flat_equations(nest)
    if not eqs:
        return None
    run = [start]
    for j in range(start + 1, len(program.nests)):
        if flat_equations(program.nests[j]) is None or program.nests[j].loops != nest.loops:
            break
        run.append(j)
    seen: set[Expr] = set()
    for eq in eqs:
        for path in value_paths(eq.rhs):
            node = node_at(eq.rhs, path)
            if not path or node in seen or not is_compound(node):
                continue
            seen.add(node)
            if hoist_problem(program, nest, node, eq, False) is not None:
                continue
            found = _common_occurrences(program, run, node)
            unguarded = any(not under_branch(flat_equations(program.nests[n])[e].rhs, p) for n, e, p in found)
            if len(found) >= 2 and (unguarded or safe_everywhere(program, node, bounds_of(nest.loops))):
                return _Common(node, eq.lhs.dtype, start, tuple(found))
    return None


def _common_occurrences(program: Program, run: list[int], node: Expr) -> list[tuple[int, int, Path]]:
    inputs = {a.name for a in value_accesses(node)}
    found = []
    for n in run:
        nest = program.nests[n]
        if inputs & set(writes(nest)):
            break
        for e, eq in enumerate(flat_equations(nest)):
            found += [(n, e, p) for p in _occurrences(nest, eq, node)]
    return found


def _eliminate(program: Program, common: _Common, nests: list[Nest], taken: set[str]) -> None:
    """Compute `common.expr` once in a nest before its run and read it at every occurrence (in place)."""
    source = program.nests[common.start]
    order = vars_in_loop_order(source, common.expr)
    name = fresh_tensor(program, taken)
    taken.add(name)
    target = Access(name, common.dtype, "g", tuple(Var(v) for v in order))
    by_nest: dict[int, list[tuple[int, Path]]] = {}
    for n, e, p in common.occurrences:
        by_nest.setdefault(n, []).append((e, p))
    for n, sites in by_nest.items():
        eqs = flat_equations(nests[n])
        for e, p in sites:
            eqs[e] = Equation(eqs[e].lhs, replace_at(eqs[e].rhs, p, target))
        nests[n] = replace(nests[n], body=tuple(eqs))
    nests.insert(common.start, compute_nest(source, common.expr, target, order, order))


@register
class CommonSubexpressionElimination(Strategy):
    """For each nest index in `nests`, compute the first sub-expression of that nest that repeats (within an
    equation, across its equations, or in the following nests with the same loops) once, in a new nest placed
    before it, and read the stored value at every occurrence.

    Preconditions: each listed nest is flat; the sub-expression is an operation (not a leaf) outside any
    subscript, of the equation's float dtype without conversion, occurs at least twice (structurally equal,
    parentheses ignored) in nests that do not write what it reads, and is safe to evaluate at every iteration;
    listed nests are increasing and each one's occurrences end before the next listed nest."""

    name = "common_subexpression_elimination"
    params = ("nests",)

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        sites = [i for i in range(len(program.nests)) if _common_at(program, i) is not None]
        found = [self.action(nests=(i,)) for i in sites]
        together, end = [], -1
        for i in sites:
            if i > end:
                together.append(i)
                end = _common_at(program, i).end
        if len(together) > 1:
            found.append(self.action(nests=tuple(together)))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        starts = action["nests"]
        if not isinstance(starts, tuple) or not starts or not all(isinstance(s, int) for s in starts):
            raise IllegalActionError(f"nests must be a non-empty list of nest indices, got {starts!r}")
        commons = []
        for start in starts:
            nest_at(program, start)
            common = _common_at(program, start)
            if common is None:
                raise IllegalActionError(f"nest {start} has no repeated sub-expression that can be computed once")
            if commons and start <= commons[-1].end:
                raise IllegalActionError(f"nest {start} lies inside the run of nest {commons[-1].start}; list "
                                         "increasing nests whose runs do not overlap")
            commons.append(common)
        nests, taken = list(program.nests), set()
        for common in reversed(commons):
            _eliminate(program, common, nests, taken)
        return program.replace_nests(nests)

    def explain(self, before: Program, action: Action, after: Program) -> str:
        parts = []
        for start in action["nests"]:
            common = _common_at(before, start)
            nests = sorted({n for n, _, _ in common.occurrences})
            parts.append(f"{print_expr(common.expr)} ({len(common.occurrences)} occurrences in nest"
                         f"{'s' if len(nests) > 1 else ''} {', '.join(map(str, nests))})")
        return (f"common_subexpression_elimination computed {'; '.join(parts)} once per iteration in a new nest "
                "and replaced each occurrence by a read of the stored value. It is legal because the occurrences "
                "are structurally identical and nothing they read is written between the new nest and them, so "
                "they all hold the same value. Each repeated evaluation (often a transcendental call) becomes a "
                "load; the stored tensor costs one write and its reads.")


# -- dead_code_elimination -----------------------------------------------------------------------------------------

@register
class DeadCodeElimination(Strategy):
    """Delete nest `nest`, whose results nobody uses.

    Preconditions: every tensor the nest writes is an intermediate (not an output) that no later nest reads,
    so removing the nest cannot change an output."""

    name = "dead_code_elimination"
    params = ("nest",)

    def site(self, program: Program, index) -> None:
        nest = nest_at(program, index)
        for name in writes(nest):
            if not is_intermediate(program, name):
                raise IllegalActionError(f"nest {index} writes {name}, a signature tensor")
        readers = users(program.nests, index)
        if readers:
            raise IllegalActionError(f"nest {index}'s results are read by nest{'s' if len(readers) > 1 else ''} "
                                     f"{', '.join(map(str, readers))}")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        return [self.action(nest=i) for i in range(len(program.nests)) if holds(self.site, program, i)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        self.site(program, index)
        return program.replace_nests(program.nests[:index] + program.nests[index + 1:])

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i = action["nest"]
        nest = before.nests[i]
        return (f"dead_code_elimination deleted nest {i}, which writes {', '.join(writes(nest))}. No later nest "
                "reads these intermediates and none is an output, so the nest cannot affect the result. It "
                f"saves {trip_count(nest.loops)} iterations and the memory of the dead tensors.")
