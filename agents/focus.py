"""Nest-by-nest search: spend the budget where the work is, one loop nest at a time.

A program's runtime is close to the sum of its nests' runtimes, and most strategies act on one nest. A
search over the whole program (beam, greedy) ranks every candidate of every nest at each state, spends a
level of its budget on each step and so, on an attention block with six GEMM-like nests, reaches two or
three of them. This agent walks the nests heaviest first (estimated work: iterations times operations,
transcendental calls weighted as `TRANSCENDENTAL_WEIGHT` operations) and runs a small beam restricted to
the moves on that nest and on the nests those moves create or change (a phase), with a share of the budget
in proportion to the nest's share of the remaining work. On a contraction (a GEMM-like nest) the phase
first plays the register-tile chains of `tiles` whole, middle steps predicted and the end measured, and
its beam starts from the fastest. A phase keeps its best trusted program (measured, or any program in
model mode); the next phase starts from it. When a phase found a faster program, its chain is first
replayed on the focus nest's twins (nests equal to it up to names: an attention block's projections, see
`transfer`), each replay kept when it ends faster, so a twin costs a replay, not a phase.
A pass also plays the row-pass chain of `row_passes` whole (shared transcendentals, lane-wise reductions,
vector passes, fusion under the row loops, on every nest but contractions), middle steps predicted and the
end measured, and goes on from its end when that is faster: before the phases, or after them when the
program has contractions (the register tiles come first and need the episode's steps). Budget a phase
leaves unspent passes on, and what all phases leave goes to a last beam over the whole program (moves that
touch several nests or no nest, such as storage scopes). While a pass improved the program and budget is
left, another pass starts from it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from steptp_env.env import StepTPEnv
from steptp_env.ir.ast import BinOp, Call, equations, walk
from steptp_env.ir.printer import print_nest
from steptp_env.strategies.base import Action

from .common import AgentResult, Move, Node, Search
from .row_passes import row_pass_chain
from .tiles import is_contraction, register_tile_chains
from .transfer import named_nests, transfer, twins

TRANSCENDENTAL_WEIGHT = 8
MIN_SHARE = 0.02
"""Nests with less than this share of the start program's work get no phase of their own."""


def nest_work(nest) -> float:
    """Iterations times operations of a nest's equations: the order in which phases visit nests."""
    work = 0.0
    for loops, eq in equations(nest):
        ops = sum(TRANSCENDENTAL_WEIGHT if isinstance(n, Call) else 1 for n in walk(eq.rhs)
                  if isinstance(n, (BinOp, Call)))
        work += math.prod(loop.extent for loop in loops) * max(1, ops)
    return work


def _nests_of(move: Move) -> set[int] | None:
    """The nest indices a move names; None when it names none (a program-wide move)."""
    return set(named_nests(Action.parse(move.text))) or None


def _texts(node: Node) -> list[str]:
    return [print_nest(nest) for nest in node.env.program.nests]


class _Phase:
    """The nests a phase may touch: every nest of the current program that is not one of the untouched
    nests of the phase's start (`frozen`), i.e. the focus nest and whatever moves on it made or changed."""

    def __init__(self, start: Node, focus: int) -> None:
        texts = _texts(start)
        self.frozen = set(texts[:focus] + texts[focus + 1:])

    def moves(self, search: Search, node: Node) -> list[Move]:
        free = {i for i, text in enumerate(_texts(node)) if text not in self.frozen}
        return [m for m in search.moves(node) if (named := _nests_of(m)) is not None and named <= free]


def _beam(search: Search, start: Node, moves, stop_at: int, width: int, expand: int) -> Node:
    """A beam from `start` over `moves(node)` until `stop_at` budget units are spent or two levels bring no
    better trusted program; returns the best trusted node (`start` if none beat it)."""
    best, frontier, seen, stale = start, [start], {start.leir}, 0
    while frontier and stale < 2 and search.spent < stop_at and not search.exhausted:
        children = []
        for node in frontier:
            if node.depth >= search.max_depth:
                continue
            for move in search.rank_moves(node, moves(node))[:expand]:
                if search.spent >= stop_at or search.exhausted:
                    break
                child = search.step(node, move)
                if child is not None and child.leir not in seen:
                    seen.add(child.leir)
                    children.append(child)
        frontier = sorted(children, key=lambda c: c.runtime_s)[:width]
        better = min(filter(search.trusted, children), key=lambda c: c.runtime_s, default=None)
        if better is not None and better.runtime_s < best.runtime_s:
            best, stale = better, 0
        else:
            stale += 1
    return best


def _order(node: Node, done: set[str]) -> Iterable[tuple[int, float]]:
    """(index, work) of the nests not yet visited, heaviest first."""
    weights = [(i, nest_work(nest)) for i, nest in enumerate(node.env.program.nests)]
    texts = _texts(node)
    return sorted(((i, w) for i, w in weights if texts[i] not in done), key=lambda pair: -pair[1])


def _play(search: Search, node: Node, texts: list[str]) -> Node | None:
    """Step a known chain from `node`: the middle steps predicted, the last one measured (hybrid mode, see
    `RuntimeOracle.forcing`). The end node, or None when a step failed, the budget ran out or the chain
    would pass the episode's step limit."""
    if node.depth + len(texts) > search.max_depth:
        return None
    for k, text in enumerate(texts):
        if search.exhausted:
            return None
        with node.env.oracle.forcing(k == len(texts) - 1):
            node = search.step(node, Move(text, text))
        if node is None:
            return None
    return node


def _faster(search: Search, node: Node | None, than: Node) -> bool:
    return node is not None and search.trusted(node) and node.runtime_s < than.runtime_s


def _register_tiles(search: Search, node: Node, focus: int) -> Node:
    """Play the register-tile chains of the focus nest (`tiles`); the fastest trusted end, or `node`."""
    best = node
    for chain in register_tile_chains(node.env.program, focus):
        end = _play(search, node, chain)
        if _faster(search, end, best):
            best = end
    return best


def _row_passes(search: Search, node: Node) -> Node:
    """Play the row-pass chain of the program (`row_passes`); its end when trusted and faster, else `node`."""
    end = _play(search, node, row_pass_chain(node.env.program)) if not search.exhausted else None
    return end if _faster(search, end, node) else node


def _carry_over(search: Search, start: Node, focus: int, reached: Node, done: set[str]) -> Node:
    """Replay the chain that took `start` to `reached` (a phase on nest `focus`) on each twin of that nest
    (same nest up to names, untouched so far); keep a replay when its end is a trusted, faster program, and
    mark the twin's new nests visited. Returns the last kept node."""
    chain = search.actions_between(start, reached)
    base = start.env.program
    for twin in [print_nest(base.nests[i]) for i in twins(base, focus)]:
        texts = _texts(reached)
        if search.exhausted or twin not in texts:
            continue
        moved = transfer(base, focus, chain, reached.env.program, texts.index(twin))
        end = _play(search, reached, moved) if moved else None
        if _faster(search, end, reached):
            done.update(set(_texts(end)) - set(texts))
            reached = end
    return reached


def _round(search: Search, node: Node, width: int, expand: int) -> Node:
    """One pass: a phase per nest, heaviest first, then a beam over the whole program."""
    done: set[str] = set()
    program = node.env.program
    contractions = any(is_contraction(program, n) for n in range(len(program.nests)))
    if not contractions:
        node = _row_passes(search, node)
    total = sum(nest_work(nest) for nest in node.env.program.nests)
    while not search.exhausted:
        pending = list(_order(node, done))
        remaining = sum(w for _, w in pending)
        if not pending or pending[0][1] < MIN_SHARE * total:
            break
        focus, work = pending[0]
        done.add(_texts(node)[focus])
        share = max(2, round((search.budget - search.spent) * work / remaining))
        phase = _Phase(node, focus)
        tiled = _register_tiles(search, node, focus)
        reached = _beam(search, tiled, lambda n: phase.moves(search, n), search.spent + share, width, expand)
        done.update(set(_texts(reached)) - phase.frozen)
        if reached is not node:
            reached = _carry_over(search, node, focus, reached, done)
        node = reached
    if contractions:
        node = _row_passes(search, node)
    return _beam(search, node, search.moves, search.budget, width, expand)


def run(env: StepTPEnv, budget: int, seed: int, width: int = 2, expand: int = 3) -> AgentResult:
    search = Search(env, budget, seed, "focus")
    node = search.root()
    while not search.exhausted:  # another pass over the nests while the last one found something
        reached = _round(search, node, width, expand)
        if reached is node:
            break
        node = reached
    return search.result()
