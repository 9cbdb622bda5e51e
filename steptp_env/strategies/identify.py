"""`identify`: which single action turns one program into another, up to the names of fresh tensors and
loop variables. This labels free-form LLM answers and imported Step-TP rows."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ..errors import StepTPError
from ..ir.ast import Equation, Loop, Nest, accesses, all_loops, equations, rename_var, replace_accesses
from ..ir.printer import print_nests
from ..ir.program import Program
from .base import REGISTRY, STRATEGY_NAMES, Action
from .loops import GPU_AXES


def canonical_text(program: Program) -> str:
    """LEIR text with intermediates renamed in order of first appearance and every nest's loop variables
    renamed in loop order (bound loops keep their axis prefix), so programs differing only in fresh names compare equal."""
    known = {t.name for t in program.signature.tensors}
    tensors: dict[str, str] = {}
    for nest in program.nests:
        for _, eq in equations(nest):
            for name in [eq.lhs.name] + [a.name for a in _reads(eq)]:
                if name not in known and name not in tensors:
                    tensors[name] = f"Q{len(tensors)}q"

    def rename_tensor(acc):
        return replace(acc, name=tensors.get(acc.name, acc.name))

    nests = []
    for nest in program.nests:
        loops = {l.var: _bound_axis(l) + f"z{i}" for i, l in enumerate(all_loops(nest))}
        nests.append(_rewrite(nest, loops, rename_tensor))
    return print_nests(tuple(nests))


def _bound_axis(loop: Loop) -> str:
    """A bound loop keeps its hardware-axis prefix (`bya` binds blockIdx.y): binding to another axis is a
    different program."""
    return loop.var[:2] if loop.kind == "B" and loop.var[:2] in GPU_AXES else ""


def _reads(eq: Equation):
    yield from accesses(eq.rhs)
    for index in eq.lhs.indices:
        yield from accesses(index)


def _rewrite(nest: Nest, loops: dict[str, str], rename_tensor) -> Nest:
    def expr(e):
        e = replace_accesses(e, rename_tensor)
        for old, new in loops.items():
            e = rename_var(e, old, new)
        return e

    body = tuple(_rewrite(s, loops, rename_tensor) if isinstance(s, Nest) else Equation(expr(s.lhs), expr(s.rhs))
                 for s in nest.body)
    return replace(nest, loops=tuple(Loop(l.kind, l.extent, loops[l.var]) for l in nest.loops), body=body)


def identify(before: Program, after: Program, strategies: Iterable[str] | None = None) -> list[Action]:
    """Every action (candidate, or inferred by a strategy for parameters outside its menu) that turns
    `before` into `after` up to fresh names; [] when no single action does. `strategies` limits the search
    to those (to confirm a given label, one is enough: each strategy is tried on its own)."""
    target = canonical_text(after)
    found: list[Action] = []
    wanted = None if strategies is None else set(strategies)
    for name in STRATEGY_NAMES:
        strategy = REGISTRY.get(name)
        if strategy is None or (wanted is not None and name not in wanted):
            continue
        tried = set()
        for action in [*strategy.candidates(before, "cuda" if _has_binding(after) else "llvm"),
                       *strategy.infer(before, after)]:
            if action in tried:
                continue
            tried.add(action)
            try:
                result = strategy.apply(before, action)
            except StepTPError:
                continue
            if canonical_text(result) == target or strategy.matches_spelling(result, after):
                found.append(action)
    return found


def _has_binding(program: Program) -> bool:
    return any(l.kind == "B" for n in program.nests for l in all_loops(n))
