"""Recorded episodes as a Minari dataset, for offline RL on the numeric observations (the `minari` extra).

Observations are the env's `features` vectors (`Box(-100, 100, (FEATURES,))`, as recorded before and
after each step), actions the catalog indices (`Discrete(catalog size)`), rewards the env's log-speedup
rewards. Episodes are the filtered ones of `filter_episodes`, cut before the first step that has no
catalog index or no recorded observation (a text-mode step beyond the catalog's slots, or an env with
text observations); each episode ends truncated, since the recording stopped there, not the env.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Iterable
from unittest import mock

import numpy as np

from .filters import FilterConfig, FilterReport, filter_episodes
from .records import load_steps


def _usable(episode: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept = []
    for step in episode:
        if step.get("index") is None or step.get("obs_before") is None or step.get("obs_after") is None:
            break
        kept.append(step)
    return kept


def episode_buffers(episodes: list[list[dict[str, Any]]]) -> list[Any]:
    """Minari `EpisodeBuffer`s of the episodes that have at least one usable step."""
    from minari.data_collector import EpisodeBuffer

    buffers = []
    for episode in filter(None, map(_usable, episodes)):
        observations = [np.asarray(episode[0]["obs_before"], np.float32)]
        observations += [np.asarray(s["obs_after"], np.float32) for s in episode]
        buffers.append(EpisodeBuffer(id=len(buffers), observations=observations,
                                     actions=[int(s["index"]) for s in episode],
                                     rewards=[float(s["reward"]) for s in episode],
                                     terminations=[False] * len(episode),
                                     truncations=[False] * (len(episode) - 1) + [True]))
    return buffers


def export_minari(inputs: Iterable[Path | str], root: Path | str, dataset_id: str = "steptp/trajectories-v0",
                  config: FilterConfig = FilterConfig()) -> tuple[Any, FilterReport]:
    """Write the recorded episodes under `root` as Minari dataset `dataset_id`; returns (dataset, report)."""
    import gymnasium as gym
    import minari

    from ..env import FEATURES, ActionCatalog

    _, steps = load_steps(inputs)
    episodes, report = filter_episodes(steps, config)
    buffers = episode_buffers(episodes)
    if not buffers:
        raise ValueError("no episode has numeric observations and catalog indices to export")
    # minari keeps datasets under $MINARI_DATASETS_PATH: point it at `root` for the call
    with mock.patch.dict(os.environ, {"MINARI_DATASETS_PATH": str(Path(root).resolve())}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="minari")  # author, permalink, env spec unset
        dataset = minari.create_dataset_from_buffers(
            dataset_id, buffers, observation_space=gym.spaces.Box(-100.0, 100.0, (FEATURES,), np.float32),
            action_space=gym.spaces.Discrete(ActionCatalog().size), algorithm_name="steptp_env recorder",
            description="steptp_env episodes: features of LEIR programs, catalog actions, log-speedup rewards.",
            data_format="arrow")
    return dataset, report
