"""`Recorder`: a Gymnasium wrapper that writes every reset and step of a `StepTPEnv` to a trajectory file.

Each step record is self-contained (programs before and after, runtimes and where they came from, the
verify report, the strategy's explanation, the numeric observations), so exporters and filters can work
on single steps without replaying anything. The record format is described in `records.py`.
"""
from __future__ import annotations

import datetime
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
    """The settings of an (unwrapped) env that decide what its trajectories contain."""
    return {"workloads": list(env.uris), "preset": env.preset, "mode": env.mode, "action_mode": env.action_mode,
            "obs_mode": env.obs_mode, "target": env.target, "dtype": env.dtype, "max_steps": env.max_steps,
            "penalty": env.penalty, "verify_steps": env.verify_steps}


def features(obs: Any) -> list[float] | None:
    """The numeric observation as a JSON list (float32 values in their shortest exact form), or None
    for text observations."""
    if not isinstance(obs, dict) or "features" not in obs:
        return None
    return [float(str(v)) for v in np.asarray(obs["features"], np.float32)]


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
            created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            header = {"config": config or env_config(env.unwrapped), "versions": versions(), "created": created}
            sink = JsonlWriter(path, header)
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
        self._context = {"workload": env.workload.uri, "preset": env.state.preset, "dtype": env.dtype,
                         "target": env.target}
        self.sink.write({"kind": "reset", "episode": self.episode, **self._context, "mode": env.mode,
                         "leir": info["leir"], "signature": info["signature"], "runtime_s": info["runtime_s"],
                         "runtime_source": self._source, "obs": features(obs)})
        return obs, info

    def step(self, action):
        env = self.env.unwrapped
        before, runtime_before, groups = env.program, env.runtime_s, env.groups
        self._steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = self.step_record(env, action, before, runtime_before, groups, obs, reward, terminated,
                                  truncated, info)
        if record["after"] is not None:
            self._obs, self._source = obs, info.get("runtime_source")
        self.sink.write(record)
        return obs, reward, terminated, truncated, info

    def step_record(self, env, action, before, runtime_before: float, groups, obs, reward: float,
                    terminated: bool, truncated: bool, info: dict[str, Any]) -> dict[str, Any]:
        text = info.get("action") or (action if isinstance(action, str) else None)
        moved = info["error"] is None and text not in (None, "stop")
        verify = info.get("verify")
        if moved and verify is None and self.verify:
            verify = check(env.program, env.workload, env.target, env.oracle.protocol)
        return {"kind": "step", "episode": self.episode, "step": self._steps, "key": None, **self._context,
                "action": text,
                "index": _index(env, action, text, groups), "strategy": info.get("strategy"),
                "before": {"leir": before.leir, "signature": before.signature.to_json()},
                "after": {"leir": env.program.leir, "signature": env.program.signature.to_json()} if moved else None,
                "explain": info.get("explain"), "verify": verify, "runtime_before_s": runtime_before,
                "runtime_after_s": info["runtime_s"] if moved else None, "source_before": self._source,
                "source_after": info.get("runtime_source") if moved else None, "reward": float(reward),
                "error": info["error"], "terminated": bool(terminated), "truncated": bool(truncated),
                "obs_before": features(self._obs), "obs_after": features(obs) if moved else None}

    def close(self) -> None:
        if isinstance(self.sink, JsonlWriter):
            self.sink.close()
        super().close()


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
