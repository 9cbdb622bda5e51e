"""Monte Carlo tree search with UCT.

Every node may expand its `width` best-ranked candidates (cost-model order). An iteration descends by UCT
through fully expanded nodes, steps one untried move, and backs the child's log speedup over the start up
the path. There are no random rollouts: every rollout step would spend budget, and the step itself already
gives the value. A node with nothing left to expand below it is closed, so a small space ends the search.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from steptp_env.env import StepTPEnv

from .common import AgentResult, Move, Node, Proposer, Search


@dataclass
class _Tree:
    node: Node
    untried: list[Move] | None = None  # ranked on the first visit
    children: list[_Tree] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0
    closed: bool = False

    def uct(self, parent_visits: int, c: float) -> float:
        return self.total / self.visits + c * math.sqrt(math.log(parent_visits) / self.visits)


def run(env: StepTPEnv, budget: int, seed: int, width: int = 4, c: float = 0.5,
        proposer: Proposer | None = None) -> AgentResult:
    search = Search(env, budget, seed, "mcts" if proposer is None else "llm-mcts", proposer=proposer)
    root = _Tree(search.root())
    while not search.exhausted and not root.closed:
        path = [root]
        tree = root
        while True:
            if tree.untried is None and tree.node.depth < search.max_depth:
                tree.untried = search.rank(tree.node)[:width]
            if tree.untried:
                break
            open_children = [child for child in tree.children if not child.closed]
            if not open_children:
                tree.closed = True
                break
            parent = tree
            tree = max(open_children, key=lambda child: child.uct(parent.visits, c))
            path.append(tree)
        if tree.closed:
            continue
        reached = search.step(tree.node, tree.untried.pop(0))
        if reached is None:
            continue
        leaf = _Tree(reached)
        tree.children.append(leaf)
        path.append(leaf)
        value = math.log(search.initial_s / reached.runtime_s)
        for visited in path:
            visited.visits += 1
            visited.total += value
    return search.result()
