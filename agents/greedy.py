"""Greedy descent: from each state, step the `width` candidates the cost model ranks fastest and move to
the fastest of them by the runtime the step returned (measured where the mode measures); stop at a local
optimum, at the env's `max_steps` or when the budget is spent.
"""
from __future__ import annotations

from steptp_env.env import StepTPEnv

from .common import AgentResult, Proposer, Search


def run(env: StepTPEnv, budget: int, seed: int, width: int = 4, proposer: Proposer | None = None) -> AgentResult:
    search = Search(env, budget, seed, "greedy" if proposer is None else "llm-greedy", proposer=proposer)
    node = search.root()
    while node.depth < search.max_depth and not search.exhausted:
        children = []
        for move in search.rank(node)[:width]:
            if search.exhausted:
                break
            children.append(search.step(node, move))
        best = min((c for c in children if c is not None), key=lambda c: c.runtime_s, default=None)
        if best is None or best.runtime_s >= node.runtime_s:
            break
        node = best
    return search.result()
