"""Recorded episodes as a Minari dataset, for offline RL on the numeric observations (the `minari` extra).

Observations are the env's vector observations as recorded before and after each step: `features`
(`Box(-100, 100, (FEATURES,))`) and `action_mask` (`MultiBinary(catalog size)`), the Dict space
`StepTPEnv(obs_mode="vector")` has; actions the catalog indices (`Discrete(catalog size)`), rewards the
env's log-speedup rewards. Episodes are the filtered ones of `filter_episodes`, cut before the first step
that has no catalog index or no recorded observation (a text-mode step beyond the catalog's slots, an env
with text observations, a file from before masks were recorded). An episode the policy ended with the stop
action, with nothing cut, keeps that step and ends terminated; any other ends truncated (the recording
stopped there, not the env). Each episode's `options` name its workload, so `reset(options=...)` of the
recovered env starts where it started.

The dataset carries an env spec (`minari.recover_environment` / `dataset.recover_environment()` makes a
`StepTPEnv` with the recording's settings). Minari finds datasets under `$MINARI_DATASETS_PATH` (default
`~/.minari/datasets`): `load_minari(root, dataset_id)` loads one from the folder it was exported to.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable
from unittest import mock

import numpy as np

from ..env.catalog import STOP
from .filters import FilterConfig, FilterReport, episode_key, filter_episodes
from .records import load_steps

DATASET_ID = "steptp/trajectories-v0"


def _usable(episode: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept = []
    for step in episode:
        if any(step.get(k) is None for k in ("index", "obs_before", "obs_after", "legal_before", "legal_after")):
            break
        kept.append(step)
    return kept


def _observation(feats: list[float], allowed: list[int], size: int) -> dict[str, np.ndarray]:
    mask = np.zeros(size, np.int8)
    mask[allowed] = 1
    return {"features": np.asarray(feats, np.float32), "action_mask": mask}


def episode_buffers(episodes: list[list[dict[str, Any]]], stops: dict[tuple[str, str], tuple[dict[str, Any], int]],
                    size: int) -> list[Any]:
    """Minari `EpisodeBuffer`s of the episodes that have at least one usable step. `stops`: the stop
    step of each recorded episode that a policy ended (by `episode_key`); `size`: the catalog's."""
    from minari.data_collector import EpisodeBuffer

    buffers = []
    for recorded in episodes:
        episode = _usable(recorded)
        if not episode:
            continue
        stop, last_moved = stops.get(episode_key(episode[0]), (None, None))
        whole = stop is not None and stop.get("legal_after") is not None and episode[-1]["step"] == last_moved
        steps = episode + [stop] if whole else episode
        observations = [_observation(episode[0]["obs_before"], episode[0]["legal_before"], size)]
        observations += [_observation(s["obs_after"], s["legal_after"], size) for s in steps]
        buffers.append(EpisodeBuffer(
            id=len(buffers), options={"workload": episode[0]["workload"]},
            observations={key: [o[key] for o in observations] for key in ("features", "action_mask")},
            actions=[int(s["index"]) for s in episode] + [STOP] * whole, rewards=[float(s["reward"]) for s in steps],
            terminations=[False] * (len(steps) - 1) + [whole],
            truncations=[False] * (len(steps) - 1) + [not whole]))
    return buffers


def _stops(steps: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[dict[str, Any], int]]:
    """(the stop step, the number of the last step that moved) of each episode a policy ended by stopping:
    an exported episode that reaches that last move ends with the stop."""
    stops, moved = {}, {}
    for step in steps:
        key = episode_key(step)
        if step.get("action") == "stop" and step.get("terminated") and not step.get("error"):
            stops[key] = step
        elif step.get("after") is not None and not step.get("error"):
            moved[key] = max(moved.get(key, 0), step["step"])
    return {key: (stop, moved.get(key, 0)) for key, stop in stops.items()}


def env_spec(headers: list[dict[str, Any]], episodes: list[list[dict[str, Any]]]):
    """The Gymnasium spec of an env like the one recorded (the first header's settings, every exported
    workload), or None when the files' settings differ or are not the vector observations Minari holds."""
    import gymnasium as gym

    configs = [{k: v for k, v in h.get("config", {}).items() if k not in ("workloads", "agent", "seed", "budget")}
               for h in headers]
    if not configs or any(c != configs[0] for c in configs) or configs[0].get("obs_mode") != "vector":
        return None
    kwargs = dict(configs[0], workload=sorted({e[0]["workload"] for e in episodes}))
    return dataclasses.replace(gym.spec("steptp_env/StepTP-v1"), kwargs=kwargs, max_episode_steps=kwargs["max_steps"])


def export_minari(inputs: Iterable[Path | str], root: Path | str, dataset_id: str = DATASET_ID,
                  config: FilterConfig = FilterConfig()) -> tuple[Any, FilterReport]:
    """Write the recorded episodes under `root` as Minari dataset `dataset_id`; returns (dataset, report).
    Load it with `load_minari(root, dataset_id)` (or with `MINARI_DATASETS_PATH=root`)."""
    import gymnasium as gym
    import minari

    from ..env import FEATURES, ActionCatalog

    headers, steps = load_steps(inputs)
    episodes, report = filter_episodes(steps, config)
    size = ActionCatalog().size
    buffers = episode_buffers(episodes, _stops(steps), size)
    if not buffers:
        raise ValueError("no episode has numeric observations, action masks and catalog indices to export")
    spec = env_spec(headers, [e for e in episodes if _usable(e)])
    space = gym.spaces.Dict({"features": gym.spaces.Box(-100.0, 100.0, (FEATURES,), np.float32),
                             "action_mask": gym.spaces.MultiBinary(size)})
    with datasets_path(root), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="minari")  # author, permalink unset
        dataset = minari.create_dataset_from_buffers(
            dataset_id, buffers, env=spec, observation_space=space, action_space=gym.spaces.Discrete(size),
            algorithm_name="steptp_env recorder", data_format="arrow",
            description="steptp_env episodes: features and action masks of LEIR programs, catalog actions, "
                        "log-speedup rewards.")
    return dataset, report


@contextmanager
def datasets_path(root: Path | str) -> Iterator[None]:
    """Point Minari's `$MINARI_DATASETS_PATH` at `root` inside the block (Minari reads it on every call)."""
    with mock.patch.dict(os.environ, {"MINARI_DATASETS_PATH": str(Path(root).resolve())}):
        yield


def load_minari(root: Path | str, dataset_id: str = DATASET_ID):
    """The Minari dataset `dataset_id` that `export_minari` wrote under `root`."""
    import minari

    with datasets_path(root):
        return minari.load_dataset(dataset_id)
