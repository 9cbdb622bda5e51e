"""`Recorder`: a Gymnasium wrapper that writes every reset and step of a `StepTPEnv` to a trajectory file.

Each step record is self-contained (programs before and after, runtimes and where they came from, the
verify report, the strategy's explanation, the numeric observations), so exporters and filters can work
on single steps without replaying anything. The record format is described in `records.py`.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from ..measure.runner import versions
from ..strategies import Action
from .records import JsonlWriter
from .verification import check


class RecordSink(Protocol):
    """Where records go: a `JsonlWriter`, or a list-like buffer a generator verifies before writing."""

    def write(self, record: dict[str, Any]) -> None: ...


def env_config(env) -> dict[str, Any]:
    """The settings of an (unwrapped) env that decide what its trajectories contain: its constructor's
    arguments (`workloads` for `workload`), so an env like it can be made again (Minari's env spec)."""
    return {"workloads": list(env.uris), "preset": env.preset, "mode": env.mode, "action_mode": env.action_mode,
            "obs_mode": env.obs_mode, "target": env.target, "dtype": env.dtype, "max_steps": env.max_steps,
            "penalty": env.penalty, "verify_steps": env.verify_steps, "revisits": env.revisits,
            "uncertainty_penalty": env.uncertainty_penalty, "claim_penalty": env.claim_penalty,
            "paired_rewards": env.paired_rewards}


def features(obs: Any) -> list[float] | None:
    """The numeric observation as a JSON list (float32 values in their shortest exact form), or None
    for text observations."""
    if not isinstance(obs, dict) or "features" not in obs:
        return None
    return [float(str(v)) for v in np.asarray(obs["features"], np.float32)]


def legal(obs: Any) -> list[int] | None:
    """The catalog indices the observation's action mask allows (a short list, not the whole mask), or
    None for text observations."""
    if not isinstance(obs, dict) or "action_mask" not in obs:
        return None
    return [int(i) for i in np.flatnonzero(obs["action_mask"])]


def context(env) -> dict[str, Any]:
    """Where an (unwrapped) env's current episode comes from, as every record of it repeats."""
    return {"workload": env.workload.uri, "preset": env.state.preset, "dtype": env.dtype, "target": env.target}


def reset_record(env, episode: str, where: dict[str, Any], obs: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The `reset` record of an episode that just started on (unwrapped) `env`."""
    return {"kind": "reset", "episode": episode, **where, "mode": env.mode, "leir": info["leir"],
            "signature": info["signature"], "runtime_s": info["runtime_s"],
            "runtime_source": info.get("runtime_source"), "obs": features(obs), "legal": legal(obs)}


@dataclass(frozen=True)
class Before:
    """The state a step starts from, taken before `step` is called: its program, runtime and where that
    came from, numeric observation, and the candidate groups (for the action's catalog index)."""

    program: Any
    runtime_s: float
    source: str | None
    obs: Any
    groups: Any


def step_record(env, action, before: Before, obs: Any, reward: float, terminated: bool, truncated: bool,
                info: dict[str, Any], episode: str, number: int, where: dict[str, Any],
                verify: bool = False) -> dict[str, Any]:
    """The `step` record of one `env.step(action)` (env unwrapped, as it is after the step); with
    `verify`, a moved step the env did not verify is verified here first. The observation after a step
    is kept where the step did not fail (a stop's is the state it stopped in)."""
    text = info.get("action") or (action if isinstance(action, str) else None)
    moved = info["error"] is None and text not in (None, "stop")
    stayed = info["error"] is None
    report = info.get("verify")
    if moved and report is None and verify:
        report = check(env.program, env.workload, env.target, env.oracle.protocol)
    return {"kind": "step", "episode": episode, "step": number, "key": None, **where, "action": text,
            "index": _index(env, action, text, before.groups), "strategy": info.get("strategy"),
            "before": {"leir": before.program.leir, "signature": before.program.signature.to_json()},
            "after": {"leir": env.program.leir, "signature": env.program.signature.to_json()} if moved else None,
            "explain": info.get("explain"), "verify": report, "runtime_before_s": before.runtime_s,
            "runtime_after_s": info["runtime_s"] if moved else None, "source_before": before.source,
            "source_after": info.get("runtime_source") if moved else None, "reward": float(reward),
            "error": info["error"], "terminated": bool(terminated), "truncated": bool(truncated),
            "obs_before": features(before.obs), "obs_after": features(obs) if stayed else None,
            "legal_before": legal(before.obs), "legal_after": legal(obs) if stayed else None}


class Recorder(gym.Wrapper):
    """Records to `path` (appending; a header with the env's settings and versions on a new file) or to
    any `sink` with a `write(record)` method. With `verify=True`, a step the env did not verify (model
    and hybrid modes) is verified here before it is written, so every recorded step carries a report."""

    def __init__(self, env: gym.Env, path: Path | str | None = None, *, sink: RecordSink | None = None,
                 config: dict[str, Any] | None = None, verify: bool = False) -> None:
        super().__init__(env)
        if (path is None) == (sink is None):
            raise ValueError("give exactly one of path and sink")
        if sink is None:
            sink = JsonlWriter(path, header(config or env_config(env.unwrapped)))
        self.sink, self.verify = sink, verify
        self.episodes = 0
        self.episode: str | None = None
        self._context: dict[str, Any] = {}
        self._steps = 0
        self._obs: Any = None
        self._source: str | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        env = self.env.unwrapped
        self.episode = str(self.episodes)
        self.episodes += 1
        self._steps = 0
        self._obs, self._source = obs, info.get("runtime_source")
        self._context = context(env)
        self.sink.write(reset_record(env, self.episode, self._context, obs, info))
        return obs, info

    def step(self, action):
        env = self.env.unwrapped
        before = Before(env.program, env.runtime_s, self._source, self._obs, env.groups)
        self._steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = step_record(env, action, before, obs, reward, terminated, truncated, info, self.episode,
                             self._steps, self._context, self.verify)
        if record["after"] is not None:
            self._obs, self._source = obs, info.get("runtime_source")
        self.sink.write(record)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        if isinstance(self.sink, JsonlWriter):
            self.sink.close()
        super().close()


def header(config: dict[str, Any]) -> dict[str, Any]:
    """A trajectory file's header fields (less format and version, which `JsonlWriter` adds)."""
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"config": config, "versions": versions(), "created": created}


def _index(env, action, text: str | None, groups) -> int | None:
    """The catalog index of the step's action in the state it was taken from (None without one)."""
    if not isinstance(action, str) and action is not None:
        return int(action)
    if text is None or text == "stop" or text.startswith("leir:"):
        return None
    try:
        return env.catalog.encode(Action.parse(text), groups)
    except Exception:  # noqa: BLE001  (an unreadable action has no index; the env already reported it)
        return None
