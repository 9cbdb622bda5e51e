"""Breadth-first and depth-first search to a depth limit, over distinct programs.

Both walk the same structure, a frontier of (state, its untried moves in cost-model order): BFS takes the
oldest state's next move, DFS the newest one's, so DFS dives along the best-ranked moves first and backs
up when a state's moves run out or the depth limit is reached.
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

from steptp_env.env import StepTPEnv

from .common import AgentResult, Move, Node, Search


def _lazy_rank(search: Search, node: Node) -> Iterator[Move]:
    """Ranked moves, computed when the state is first expanded (most frontier states never are)."""
    yield from search.rank(node)


def _search(env: StepTPEnv, budget: int, seed: int, depth: int, breadth: bool) -> AgentResult:
    search = Search(env, budget, seed, "bfs" if breadth else "dfs")
    depth = min(depth, search.max_depth)
    root = search.root()
    frontier = deque([(root, _lazy_rank(search, root))])
    seen = {root.leir}
    while frontier and not search.exhausted:
        node, moves = frontier[0] if breadth else frontier[-1]
        move = next(moves, None)
        if move is None:
            frontier.popleft() if breadth else frontier.pop()
            continue
        child = search.step(node, move)
        if child is None or child.leir in seen:
            continue
        seen.add(child.leir)
        if child.depth < depth:
            frontier.append((child, _lazy_rank(search, child)))
    return search.result()


def bfs(env: StepTPEnv, budget: int, seed: int, depth: int = 2) -> AgentResult:
    return _search(env, budget, seed, depth, breadth=True)


def dfs(env: StepTPEnv, budget: int, seed: int, depth: int = 3) -> AgentResult:
    return _search(env, budget, seed, depth, breadth=False)
