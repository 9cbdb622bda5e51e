"""What every search agent shares: the budget, the log of steps taken, and the best program seen.

Agents talk to the environment only through its public API: `fork`, `step`, `action_masks`, the step's
`info` and `state`; the cost model's `oracle.predict` orders candidates without spending budget.

Budget units. In `model` mode one unit is one `step` call on the environment or any of its forks (every
runtime is a prediction, so steps are what a search spends). In `measure` and `hybrid` modes one unit is
one runtime that came from a measurement: a fresh one or a store hit (`oracle.counts["measured"] +
counts["stored"]`). Store hits count so that a run searches the same way on a cold or a warm store, and so
that a fully cached search still ends. A confident hybrid prediction costs nothing, so those modes also stop
after `STEPS_PER_UNIT * budget` steps.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from steptp_env.data.records import JsonlWriter
from steptp_env.data.recorder import Before, context, env_config, header, reset_record, step_record
from steptp_env.env import STOP, EnvState, StepTPEnv
from steptp_env.errors import StepTPError
from steptp_env.strategies import apply_action

STEPS_PER_UNIT = 8

StepListener = Callable[[dict[str, Any], "Search"], None]
Proposer = Callable[["Node"], list["Move"]]
"""Moves for a state in the order to try them, in place of the cost model's ranking (an LLM's proposals)."""
_listener: contextvars.ContextVar[StepListener | None] = contextvars.ContextVar("steptp_agent_listener",
                                                                                 default=None)


@contextlib.contextmanager
def watch(listener: StepListener) -> Iterator[None]:
    """Call `listener(entry, search)` after every step of the searches run inside the block (the
    CLI's progress bar), without every agent passing a callback along."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


@dataclass(frozen=True)
class Move:
    """One candidate: what `step` takes (a catalog index, or the text in text mode) and the action text."""

    action: int | str
    text: str


@dataclass
class Node:
    """A reached state. `env` belongs to this node alone (a fork); `entry` is the trajectory index of the
    step that reached it (-1 for the start)."""

    env: StepTPEnv
    runtime_s: float
    obs: Any
    entry: int = -1
    depth: int = 0

    @property
    def leir(self) -> str:
        return self.env.program.leir


@dataclass
class AgentResult:
    """The outcome of one agent run. `trajectory` holds every step the search took, in order, each with its
    `parent` (the entry whose state it started from, -1 for the start); `state` is the episode that reached
    the best program, replayable with `env.apply` or the replay agent.

    The `compared_*` fields and `torch_s` come from `agents.compare.compare` after the search: the start
    program, the best program and PyTorch eager timed in turn in one process under one thread count, since
    the runtimes the search saw were taken minutes apart (or predicted). They stay None until then, and
    wherever a figure could not be taken; `compared_note` says why."""

    agent: str
    workload: str
    mode: str
    best_leir: str
    best_runtime_s: float
    initial_runtime_s: float
    best_source: str
    best_entry: int
    state: EnvState
    trajectory: list[dict[str, Any]]
    counts: dict[str, int]
    spent: int
    budget: int
    compared_start_s: float | None = None
    compared_best_s: float | None = None
    torch_s: float | None = None
    compared_threads: int | None = None
    compared_note: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.initial_runtime_s / self.best_runtime_s

    @property
    def compared_speedup(self) -> float | None:
        """Start / best, both from the side-by-side timing."""
        if self.compared_start_s is None or self.compared_best_s is None:
            return None
        return self.compared_start_s / self.compared_best_s

    @property
    def best_vs_torch(self) -> float | None:
        """Best / PyTorch eager from the side-by-side timing: below 1 the best program beats PyTorch."""
        if self.compared_best_s is None or self.torch_s is None:
            return None
        return self.compared_best_s / self.torch_s

    @property
    def measurements(self) -> int:
        """Fresh measurements taken during the run (store hits excluded)."""
        return self.counts["measured"]

    def path(self) -> list[dict[str, Any]]:
        """The steps of the best episode, from the start to the best program."""
        steps, entry = [], self.best_entry
        while entry >= 0:
            steps.append(self.trajectory[entry])
            entry = self.trajectory[entry]["parent"]
        return steps[::-1]

    def save(self, folder: Path | str) -> Path:
        """Write the run: state.json (the best episode, for `env.apply` and replay), trajectory.jsonl (every
        step the search took, in the trajectory format `steptp export` reads: a header, the reset, then one
        step record a line, each with its `parent` step) and summary.json."""
        folder = Path(folder)
        self.state.save(folder / "state.json")
        (folder / "trajectory.jsonl").unlink(missing_ok=True)
        with JsonlWriter(folder / "trajectory.jsonl", header(self.config)) as writer:
            for record in self.records:
                writer.write(record)
        (folder / "summary.json").write_text(json.dumps(self.summary(), indent=1) + "\n")
        return folder

    def summary(self) -> dict[str, Any]:
        return {"agent": self.agent, "workload": self.workload, "mode": self.mode, "budget": self.budget,
                "spent": self.spent, "steps": len(self.trajectory), "counts": self.counts,
                "initial_runtime_s": self.initial_runtime_s, "best_runtime_s": self.best_runtime_s,
                "speedup": self.speedup, "best_source": self.best_source, "best_leir": self.best_leir,
                "compared_start_s": self.compared_start_s, "compared_best_s": self.compared_best_s,
                "compared_speedup": self.compared_speedup, "torch_s": self.torch_s,
                "best_vs_torch": self.best_vs_torch, "compared_threads": self.compared_threads,
                "compared_note": self.compared_note}


@dataclass
class _Best:
    runtime_s: float
    source: str
    leir: str
    state: EnvState
    entry: int = -1


class Search:
    """One agent run on `env`: resets it with `seed` (and `workload`, if given) and keeps the budget, the
    log of steps and the best state."""

    def __init__(self, env: StepTPEnv, budget: int, seed: int, agent: str, workload: str | None = None,
                 proposer: Proposer | None = None) -> None:
        if budget < 1:
            raise ValueError(f"budget must be at least 1, got {budget}")
        self.env, self.budget, self.agent = env.unwrapped, budget, agent
        self.rng = random.Random(seed)
        self.trajectory: list[dict[str, Any]] = []
        self._counts = dict(self.env.oracle.counts)
        self._steps = 0
        obs, info = self.env.reset(seed=seed, options={"workload": workload} if workload else None)
        initial, source = info["runtime_s"], info["runtime_source"]  # measured unless in model mode
        self.initial_s, self._start_source = initial, source
        self._where = context(self.env)
        self.records = [reset_record(self.env, "0", self._where, obs, info)]
        self.config = dict(env_config(self.env), agent=agent, seed=seed, budget=budget)
        self._root = Node(self.env, initial, obs)
        self._best = _Best(initial, source, self.env.program.leir, self.env.state)
        self._listener = _listener.get()
        self._proposer = proposer

    # -- budget ----------------------------------------------------------------------------------------
    @property
    def spent(self) -> int:
        if self.env.mode == "model":
            return self._steps
        counts = self.env.oracle.counts
        return sum(counts[k] - self._counts[k] for k in ("measured", "stored"))

    @property
    def best_speedup(self) -> float:
        return self.initial_s / self._best.runtime_s

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.budget or self._steps >= STEPS_PER_UNIT * self.budget

    # -- states and moves ------------------------------------------------------------------------------
    def root(self) -> Node:
        """The starting state (its env is the caller's env: step it with `fork=True` to keep it intact)."""
        return self._root

    def fresh(self) -> Node:
        """A new episode at the start, on its own fork (to step in place)."""
        return Node(self._root.env.fork(), self._root.runtime_s, self._root.obs)

    @property
    def max_depth(self) -> int:
        return self.env.max_steps

    @staticmethod
    def moves(node: Node) -> list[Move]:
        """The legal non-stop candidates of a state, in the catalog's (deterministic) order."""
        env = node.env
        if env.action_mode == "text":
            return [Move(text, text) for text in env.candidate_texts()]
        legal = np.flatnonzero(env.action_masks())
        return [Move(int(i), env.catalog.decode(int(i), env.groups).text) for i in legal if i != STOP]

    def predict(self, node: Node, move: Move) -> float:
        """The cost model's runtime for a move (no step, no budget); inf when it does not apply or its
        program cannot be lowered for the model's features (the step itself would report why)."""
        try:
            return node.env.oracle.predict(apply_action(node.env.program, move.text)).runtime_s
        except StepTPError:
            return math.inf

    def trusted(self, node: Node) -> bool:
        """Whether a state's runtime may count as a result: any in model mode, a measured (or stored) one
        otherwise; a hybrid prediction guides the search but never becomes its best."""
        return self.env.mode == "model" or node.entry < 0 or self.trajectory[node.entry]["source"] != "predicted"

    def rank(self, node: Node) -> list[Move]:
        """The moves of a state, fastest predicted first; a seeded shuffle when there is no cost model
        (measure mode); the proposer's moves when the search has one."""
        if self._proposer is not None:
            return self._proposer(node)
        return self.rank_moves(node, self.moves(node))

    def rank_moves(self, node: Node, moves: list[Move]) -> list[Move]:
        """`moves` (some of the state's moves) in the cost model's order, as `rank` without a proposer."""
        moves = list(moves)
        if node.env.oracle.model is None:
            self.rng.shuffle(moves)
            return moves
        predicted = [self.predict(node, m) for m in moves]
        return [m for _, m in sorted(zip(predicted, moves), key=lambda pair: pair[0])]

    def actions_between(self, start: Node, end: Node) -> list[str]:
        """The action texts of the steps that led from `start` to `end` (a descendant of it), in order."""
        texts, entry = [], end.entry
        while entry != start.entry:
            if entry < 0:
                raise ValueError("the end node does not descend from the start node")
            texts.append(self.trajectory[entry]["action"])
            entry = self.trajectory[entry]["parent"]
        return texts[::-1]

    # -- stepping --------------------------------------------------------------------------------------
    def step(self, node: Node, move: Move, fork: bool = True) -> Node | None:
        """Take `move` from `node` (on a fork unless `fork=False`), log it, and return the new state, or None
        when the step failed (the failure is logged with its error). The log's `verified` is True when the
        step checked its program against the model (every measured step, every step in hybrid mode by
        default), None when it did not."""
        source = self._start_source if node.entry < 0 else self.trajectory[node.entry]["source"]
        before = Before(node.env.program, node.runtime_s, source, node.obs, node.env.groups)
        env = node.env.fork() if fork else node.env
        obs, reward, terminated, truncated, info = env.step(move.action)
        self._steps += 1
        error = info["error"]
        runtime = None if error else info["runtime_s"]
        entry = {"step": len(self.trajectory), "action": info["action"] or move.text, "reward": reward,
                 "runtime_s": runtime, "speedup": None if error else self.initial_s / runtime,
                 "source": info.get("runtime_source"), "verified": True if info["verified"] else None,
                 "error": error, "parent": node.entry, "depth": node.depth if error else node.depth + 1,
                 "spent": self.spent}
        self.trajectory.append(entry)
        record = step_record(env, move.action, before, obs, reward, terminated, truncated, info, "0",
                             entry["step"] + 1, self._where)
        self.records.append(dict(record, parent=node.entry + 1, depth=entry["depth"], spent=entry["spent"]))
        if self._listener is not None:
            self._listener(entry, self)
        if error:
            return None
        child = Node(env, runtime, obs, len(self.trajectory) - 1, node.depth + 1)
        if self.trusted(child) and runtime < self._best.runtime_s:
            self._best = _Best(runtime, entry["source"], child.leir, env.state, child.entry)
        return child

    def result(self) -> AgentResult:
        counts = {k: self.env.oracle.counts[k] - self._counts[k] for k in self._counts}
        return AgentResult(self.agent, self.env.workload.uri, self.env.mode, self._best.leir,
                           self._best.runtime_s, self.initial_s, self._best.source, self._best.entry,
                           self._best.state, self.trajectory, counts, self.spent, self.budget,
                           records=self.records, config=self.config)
