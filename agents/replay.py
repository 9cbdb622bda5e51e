"""Replay a recorded episode (an `EnvState`, its JSON file, or a list of action texts) step by step, so
its runtimes and sources are logged like any search's. Replays at most `budget` units. The result's state
is the whole replayed episode (a search's is the path to its best program)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from steptp_env.env import EnvState, StepTPEnv
from steptp_env.errors import StepTPError

from .common import AgentResult, Search


def run(env: StepTPEnv, budget: int, seed: int, *, state: EnvState | Path | str | Sequence[str]) -> AgentResult:
    if isinstance(state, (str, Path)):
        state = EnvState.load(state)
    workload = None
    if isinstance(state, EnvState):
        unwrapped = env.unwrapped
        if state.preset is not None and state.preset != unwrapped.preset:
            raise ValueError(f"the state is for preset {state.preset!r}, the env has {unwrapped.preset!r}")
        workload, actions = state.workload, state.actions
    else:
        actions = list(state)
    if not actions:
        raise ValueError("nothing to replay: give a state (or its file) with at least one action")
    search = Search(env, budget, seed, "replay", workload=workload)
    node = search.root()
    for text in actions:
        if search.exhausted:
            break
        move = next((m for m in search.moves(node) if m.text == text), None)
        if move is None:
            raise StepTPError(f"cannot replay {text[:120]!r}: not a candidate of the state it was recorded "
                              "in (ranks beyond the catalog's slots need a text-mode env; free-form `leir:` "
                              "rewrites replay with env.apply)")
        node = search.step(node, move, fork=False)
        if node is None:
            raise StepTPError(f"replay failed at {text[:120]!r}: {search.trajectory[-1]['error']}")
    return dataclasses.replace(search.result(), state=node.env.state)
