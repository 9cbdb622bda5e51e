"""Search agents and policies over `StepTPEnv`, built on its public API only.

Every agent is `run(env, budget, seed, **options) -> AgentResult`; `budget` is in env steps in `model`
mode and in measured runtimes otherwise (see `agents.common`). `replay` needs `state=`; `ppo` takes
`policy=` (a trained model or its .zip) and otherwise trains for `budget` timesteps first; `llm` takes
`model=` (a model folder, a .gguf file or an OpenAI-compatible URL) and needs a text-mode env.
"""
from __future__ import annotations

from typing import Any, Callable

from steptp_env.env import StepTPEnv

from . import beam, focus, greedy, llm, mcts, random_search, replay, tree
from .common import AgentResult, Search, watch

Agent = Callable[..., AgentResult]


def _ppo(env: StepTPEnv, budget: int, seed: int, **options: Any) -> AgentResult:
    """`agents.ppo.run`, imported on use: it needs the optional `rl` extra (stable-baselines3, sb3-contrib)."""
    from .ppo import run

    return run(env, budget, seed, **options)


AGENTS: dict[str, Agent] = {"random": random_search.run, "greedy": greedy.run, "beam": beam.run, "focus": focus.run,
                            "bfs": tree.bfs, "dfs": tree.dfs, "mcts": mcts.run, "replay": replay.run, "ppo": _ppo,
                            "llm": llm.run}


def get_agent(name: str) -> Agent:
    """The agent called `name`; a KeyError lists the known ones."""
    if name not in AGENTS:
        raise KeyError(f"unknown agent {name!r}; known: {', '.join(AGENTS)}")
    return AGENTS[name]


__all__ = ["AGENTS", "Agent", "AgentResult", "Search", "get_agent", "watch"]
