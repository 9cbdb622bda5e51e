"""Random search: independent random walks from the start, the baseline every other agent must beat.

Each walk picks uniformly among the legal moves and stop (so it ends on stop or at the env's `max_steps`);
walks repeat until the budget is spent.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from steptp_env.env import StepTPEnv

from .common import AgentResult, Search

Policy = Callable[[Any, np.ndarray], int]


def run(env: StepTPEnv, budget: int, seed: int) -> AgentResult:
    search = Search(env, budget, seed, "random")
    while not search.exhausted:
        node = search.fresh()
        for _ in range(search.max_depth):
            moves = search.moves(node)
            pick = search.rng.randrange(len(moves) + 1)
            if pick == len(moves) or search.exhausted:
                break
            node = search.step(node, moves[pick], fork=False) or node
    return search.result()


def random_policy(seed: int) -> Policy:
    """The same rule as an index-mode policy `(obs, mask) -> action` (stop included), for comparisons with
    learned policies on the same episodes."""
    rng = np.random.default_rng(seed)
    return lambda obs, mask: int(rng.choice(np.flatnonzero(mask)))
