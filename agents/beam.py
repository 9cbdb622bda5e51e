"""Beam search: keep the `beam` fastest distinct programs of each depth; expand each by its `expand`
best-ranked candidates (cost model order).
"""
from __future__ import annotations

from steptp_env.env import StepTPEnv

from .common import AgentResult, Proposer, Search


def run(env: StepTPEnv, budget: int, seed: int, beam: int = 4, expand: int = 4,
        proposer: Proposer | None = None) -> AgentResult:
    search = Search(env, budget, seed, "beam" if proposer is None else "llm-beam", proposer=proposer)
    frontier = [search.root()]
    seen = {frontier[0].leir}
    for _ in range(search.max_depth):
        children = []
        for node in frontier:
            for move in search.rank(node)[:expand]:
                if search.exhausted:
                    break
                child = search.step(node, move)
                if child is not None and child.leir not in seen:
                    seen.add(child.leir)
                    children.append(child)
        if not children:
            break
        frontier = sorted(children, key=lambda c: c.runtime_s)[:beam]
    return search.result()
