"""`identify`: which single action turns one program into another, up to the names of fresh tensors and
loop variables. This labels free-form LLM answers and imported Step-TP rows."""
from __future__ import annotations

from typing import Iterable

from ..errors import StepTPError
from ..ir.ast import all_loops
from ..ir.canonical import canonical_text
from ..ir.program import Program
from .base import REGISTRY, STRATEGY_NAMES, Action


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
