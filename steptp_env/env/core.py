"""`StepTPEnv`: one episode optimises one workload's LEIR program, one atomic strategy per step.

Each accepted step lowers the new program and gets its runtime from the `RuntimeOracle` (measured, from
the store, or predicted); the reward is `log(t_before / t_after)`, so an episode's return is the log of
its total speedup. A measured step's runtime is, by default, a paired one: the new program and the episode's
last measured program are timed interleaved in one worker run until the ratio's 95% interval is within +-3%
(`measure.paired`), and the new runtime is the earlier one divided by that ratio; `info["paired"]` holds the
ratio, its interval and the rounds, `info["measured_runtime_s"]` the program's own measured median.
An action that is illegal, fails to build, or is not equivalent gets `penalty`, leaves
the state as it was and explains itself in `info["error"]`. `step` never raises for anything a policy
can send; only API misuse does (bad constructor arguments, `step` before `reset`).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import string
import time
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .. import MAX_STEPS
from ..costmodel import CostModel, default_model
from ..costmodel.features import SIZE
from ..errors import StepTPError
from ..frontend.workload import Workload, is_saved_workload
from ..ir.canonical import canonical_text
from ..ir.program import Program
from ..measure import Protocol, ResultStore, measure_pair
from ..measure.runner import measure, versions
from ..strategies import Action, apply_action, get_strategy, identify
from ..workloads import get_workload, list_workloads
from .answer import read_proposal
from .catalog import STOP, ActionCatalog
from .revisits import REVISITS, revisiting
from .runtime import MODES, Estimate, RuntimeOracle
from .state import EnvState

FEATURES = SIZE + 3  # program features, then step fraction, log speedup so far, log runtime
TEXT_CHARSET = frozenset(string.printable)
TEXT_LIMIT = 1 << 20
MODE_METADATA = {
    "measure": {"deterministic": False, "platform_dependent": True},
    "model": {"deterministic": True, "platform_dependent": False},
    "hybrid": {"deterministic": False, "platform_dependent": True},
}


def _squash(x: np.ndarray) -> np.ndarray:
    """Features span many orders of magnitude; a signed log keeps them in a range networks like."""
    return np.clip(np.sign(x) * np.log1p(np.abs(x)), -100.0, 100.0).astype(np.float32)


def _protocol(mode: str, protocol: Protocol | None, model: CostModel | None) -> Protocol:
    """The measurement protocol: the one given, else the cost model's thread count where a model predicts
    (model and hybrid modes; the packaged model's is 1), else all cores. A model trained under another thread
    count is refused: its predictions are runtimes under its own protocol, and hybrid mode would teach it a
    mix of both."""
    trained = model.threads if model is not None and mode != "measure" else None
    if protocol is None:
        return Protocol(threads=trained) if trained else Protocol()
    if trained is not None and protocol.threads != trained:
        raise ValueError(f"the cost model was trained on timings at {trained} thread(s) and this protocol has "
                         f"{protocol.threads}: use a model trained at {protocol.threads} thread(s), "
                         f"Protocol(threads={trained}), or mode='measure'")
    return protocol


def _shown(value: object) -> str:
    """A policy's action as a message shows it: NumPy scalars and arrays as the Python values they hold
    (`1.5`, `[1, 2]`), not `np.float64(1.5)`."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


class StepTPEnv(gym.Env):
    """Gymnasium environment over LEIR programs. See the module docstring and README for the contract.

    workload: a suite URI, a glob over suite URIs (`level1/*softmax*`), a list of URIs, a `Workload` (e.g.
    from `from_torch`) or the folder `Workload.save` wrote; with several, `reset` samples one with its seed (or takes
    `options={"workload": uri}`). mode: `measure`, `model` or `hybrid`. action_mode: `index` (Discrete over
    the fixed catalog; an action text is accepted in both modes) or `text`. obs_mode: `vector` (Dict of
    features and action mask, for SB3) or `text`. uncertainty_penalty: a step paid on a predicted runtime
    gets this times the cost model's spread (its ensemble's standard deviation of log runtime) taken off its
    reward (`info["uncertainty_penalty"]`), a pessimistic reward that a policy cannot raise by steering into
    programs the model knows little about; rewards then no longer sum to the log speedup. paired_rewards
    (default: on where steps are measured) times each measured program interleaved with the episode's last
    measured one, so a reward does not move with the machine's load between two separate measurements.
    revisits: a step that leads back to a program of this episode (up to fresh names) or changes nothing is
    refused in every action form (penalty, state unchanged), so loops of undo and redo cannot farm rewards,
    and its index is masked in that state from then on (`"refuse"`, the default); `"mask"` also applies
    every candidate of each new state up front, so the mask holds none of them before any is tried (about
    2 ms per candidate: hundreds of ms per state at `small`); `"allow"` permits them. claim_penalty: a
    Step-TP answer whose `applied_strategy` is not what `identify` finds in its program (a free-form rewrite
    finds none) is still evaluated as the program it is, `info["claimed_strategy_matches"]` is False, and
    this is taken off its reward (`info["claim_penalty"]`), for LLM policies whose stated reasoning should
    match what they do. fresh: time every program again rather than serve a timing the store holds from an
    earlier run (same code, machine, protocol and workload); the new timings replace the stored ones.
    remote: `rpc://host:port/key`, measure on a free device of that RPC tracker's farm (`measure.farm`;
    stored apart from this machine's timings, and not paired).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4, "reward_range": (-math.inf, math.inf)}

    def __init__(self, workload: str | Path | Sequence[str] | Workload = "level1/matmul_square", preset: str = "small",
                 mode: str = "hybrid", action_mode: str = "index", obs_mode: str = "vector", target: str = "llvm",
                 dtype: str = "float32", max_steps: int = MAX_STEPS, penalty: float = -1.0,
                 store: ResultStore | str | Path | None = None, model: CostModel | str | Path | None = None,
                 protocol: Protocol | None = None, verify_steps: bool | None = None,
                 render_mode: str | None = None, uncertainty_penalty: float = 0.0,
                 paired_rewards: bool | None = None, revisits: str = "refuse", claim_penalty: float = 0.0,
                 fresh: bool = False, remote: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if action_mode not in ("index", "text") or obs_mode not in ("vector", "text"):
            raise ValueError("action_mode is 'index' or 'text'; obs_mode is 'vector' or 'text'")
        if target not in ("llvm", "cuda"):
            raise ValueError(f"target must be 'llvm' or 'cuda', got {target!r}")
        self.uris, self._fixed = self._workload_choices(workload)
        self.preset, self.dtype, self.target, self.mode = preset, dtype, target, mode
        self.action_mode, self.obs_mode, self.render_mode = action_mode, obs_mode, render_mode
        self.max_steps, self.penalty = max_steps, penalty
        if not uncertainty_penalty >= 0:
            raise ValueError(f"uncertainty_penalty must be >= 0, got {uncertainty_penalty!r}")
        self.uncertainty_penalty = float(uncertainty_penalty)
        if not claim_penalty >= 0:
            raise ValueError(f"claim_penalty must be >= 0, got {claim_penalty!r}")
        self.claim_penalty = float(claim_penalty)
        self.verify_steps = mode != "model" if verify_steps is None else verify_steps
        if remote is not None and paired_rewards:
            raise ValueError("paired_rewards time two programs in one worker run on this machine; with remote "
                             "devices each step is measured alone (paired_rewards=False)")
        self.paired_rewards = mode != "model" and remote is None if paired_rewards is None else bool(paired_rewards)
        if revisits not in REVISITS:
            raise ValueError(f"revisits must be one of {', '.join(REVISITS)}, got {revisits!r}")
        self.revisits = revisits
        self.metadata = dict(self.metadata, **MODE_METADATA[mode], mode=mode)
        self.catalog = ActionCatalog()
        if isinstance(store, (str, Path)) or store is None:
            store = ResultStore(store)
        if model is None and mode != "measure":
            model = default_model()
        elif isinstance(model, (str, Path)):
            model = CostModel.load(model)
        if model is not None and model.frozen and mode != "model":
            model = model.copy()  # measurements update the model online: on this environment's own copy
        self.oracle = RuntimeOracle(mode, target, _protocol(mode, protocol, model), store, model, fresh=fresh,
                                    remote=remote)
        self._workloads: dict[str, Workload] = {} if self._fixed is None else {self._fixed.uri: self._fixed}

        if action_mode == "index":
            self.action_space = spaces.Discrete(self.catalog.size)
        else:
            self.action_space = spaces.Text(TEXT_LIMIT, charset=TEXT_CHARSET)
        if obs_mode == "vector":
            self.observation_space = spaces.Dict({
                "features": spaces.Box(-100.0, 100.0, (FEATURES,), np.float32),
                "action_mask": spaces.MultiBinary(self.catalog.size)})
        else:
            text = spaces.Text(TEXT_LIMIT, charset=TEXT_CHARSET)
            self.observation_space = spaces.Dict({"leir": text, "signature": text, "candidates": text})
        self.workload: Workload | None = None
        self.program: Program | None = None
        self._state: EnvState | None = None
        self._estimate: Estimate | None = None
        self._groups: dict[str, list[Action]] | None = None
        self._anchor: tuple[Program, float] | None = None  # the last measured program of the episode, its runtime
        self._visited: set[str] = set()  # canonical texts of the episode's programs (revisits)
        self._refused: frozenset[Action] = frozenset()  # this state's candidates refused as revisits

    # -- workloads -------------------------------------------------------------------------------------
    @staticmethod
    def _workload_choices(workload) -> tuple[list[str], Workload | None]:
        if is_saved_workload(workload):
            workload = Workload.load(workload)
        if isinstance(workload, Workload):
            return [workload.uri], workload
        if isinstance(workload, str):
            uris = list_workloads(workload) if any(c in workload for c in "*?[") else [workload]
        else:
            uris = list(workload)
        if not uris or not all(isinstance(u, str) for u in uris):
            raise ValueError(f"no workloads match {workload!r}")
        return uris, None

    def _load(self, uri: str) -> Workload:
        if uri not in self._workloads:
            self._workloads[uri] = get_workload(uri, preset=self.preset, dtype=self.dtype)
        return self._workloads[uri]

    # -- the Gymnasium API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        uri = options.get("workload")
        if uri is None:
            uri = self.uris[int(self.np_random.integers(len(self.uris)))] if len(self.uris) > 1 else self.uris[0]
        self.workload = self._load(uri)
        self.program = self.workload.program
        self._state = EnvState(self.workload.uri, self.preset if self._fixed is None else self._fixed.preset,
                               self.target, self.mode, self.dtype, versions=versions())
        self._started = time.perf_counter()
        self._steps = 0
        start = self.oracle.runtime(self.program, self.workload)
        self._scale = 1.0
        if self.mode == "hybrid":  # speedups are relative to a measured start
            start = self.oracle.measure(self.program, self.workload)
            if start.runtime_s is not None:
                self._scale = start.runtime_s / self.oracle.predict(self.program).predicted_s
        if start.runtime_s is None:
            raise StepTPError(f"the starting program of {uri} has no runtime: {start.error}")
        self.initial_s = self.runtime_s = self.best_s = start.runtime_s
        self.best_program = self.program
        self._estimate = start
        self._anchor = (self.program, start.runtime_s) if start.measured else None
        self._visited = {canonical_text(self.program)} if self.revisits != "allow" else set()
        self._refused = frozenset()
        self._groups = None
        return self._observation(), self._info(error=None, action=None, estimate=start)

    def step(self, action):
        if self.program is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        self._steps += 1
        truncated = self._steps >= self.max_steps
        try:
            text = self.action_mode == "text" or isinstance(action, str)
            outcome = self._step_text(action) if text else self._step_index(action)
        except Exception as exc:  # noqa: BLE001  (a policy must never crash the run; the reason goes to info)
            outcome = {"error": f"internal error while applying the action: {type(exc).__name__}: {exc}"}
        if outcome.get("stop"):
            return self._finish(0.0, True, truncated, {"action": "stop"})
        if "error" in outcome:
            return self._finish(self.penalty, False, truncated, outcome)
        saved = self._snapshot()
        try:
            return self._accept(outcome, truncated)
        except Exception as exc:  # noqa: BLE001  (explaining, calibrating or enumerating the new program failed)
            self._restore(saved)
            error = f"internal error after the action was applied, step undone: {type(exc).__name__}: {exc}"
            return self._finish(self.penalty, False, truncated, {"error": error, "action": outcome.get("action")})

    def _accept(self, outcome: dict[str, Any], truncated: bool):
        """Make the evaluated program the new state and return the step's result; whatever raises here is
        undone by `step`."""
        after, estimate, text = outcome["program"], outcome["estimate"], outcome["action"]
        reward = math.log(self.runtime_s / estimate.runtime_s)
        if estimate.source == "predicted" and self.uncertainty_penalty:
            outcome = dict(outcome, uncertainty_penalty=self.uncertainty_penalty * estimate.spread)
            reward -= outcome["uncertainty_penalty"]
        if outcome.get("claimed_strategy_matches") is False and self.claim_penalty:
            outcome = dict(outcome, claim_penalty=self.claim_penalty)
            reward -= self.claim_penalty
        before = self.program
        self.program, self.runtime_s, self._estimate, self._groups = after, estimate.runtime_s, estimate, None
        self._calibrate(after, estimate)
        if estimate.runtime_s < self.best_s:
            self.best_s, self.best_program = estimate.runtime_s, after
        if estimate.measured:
            self._anchor = (after, estimate.runtime_s)
        if self.revisits != "allow":
            self._visited, self._refused = self._visited | {canonical_text(after)}, frozenset()
        self._state.actions.append(text)
        self._state.rewards.append(reward)
        info = dict(outcome, before=before.leir)
        info.pop("program")
        if not text.startswith("leir:"):
            chosen = Action.parse(text)
            info.update(strategy=chosen.strategy, explain=get_strategy(chosen.strategy).explain(before, chosen, after))
        return self._finish(reward, False, truncated, info)

    def _snapshot(self) -> tuple:
        """What `_accept` changes, to undo a step that failed half way."""
        return (self.program, self.runtime_s, self._estimate, self._groups, self._scale, self.best_s,
                self.best_program, self._anchor, self._visited, self._refused, len(self._state.actions),
                len(self._state.rewards))

    def _restore(self, saved: tuple) -> None:
        (self.program, self.runtime_s, self._estimate, self._groups, self._scale, self.best_s, self.best_program,
         self._anchor, self._visited, self._refused, actions, rewards) = saved
        del self._state.actions[actions:], self._state.rewards[rewards:]

    def _finish(self, reward: float, terminated: bool, truncated: bool, info: dict):
        self._state.walltime = time.perf_counter() - self._started
        info = {"error": None, "estimate": None, "action": None, "verified": False, **info}
        info = self._info(**info)
        return self._observation(), float(reward), terminated, truncated, info

    # -- actions ---------------------------------------------------------------------------------------
    def _step_index(self, action) -> dict[str, Any]:
        try:
            index = int(action)
        except (TypeError, ValueError):
            return {"error": f"index mode expects an integer action, got {_shown(action)}"}
        if isinstance(action, (float, np.floating)) and index != action:
            return {"error": f"index mode expects an integer action, got {_shown(action)}"}
        if not 0 <= index < self.catalog.size:
            return {"error": f"action {index} is outside the catalog [0, {self.catalog.size})"}
        if index == STOP:
            return {"stop": True}
        chosen = self.catalog.decode(index, self.groups)
        if chosen is None:
            return {"error": f"action {index} ({self.catalog.describe(index)}) is masked out: the strategy has "
                             "no candidate of that rank in this program"}
        return self._evaluate_action(chosen)

    def _step_text(self, action) -> dict[str, Any]:
        proposal = read_proposal(action)
        if proposal.error:
            return {"error": proposal.error}
        if proposal.action is not None:
            if proposal.action.strategy == "stop" and not proposal.action.params:
                return {"stop": True}
            return self._evaluate_action(proposal.action)
        try:
            after = Program.parse(proposal.program, self.program.signature)
        except StepTPError as exc:
            return {"error": f"the transformed program is not valid LEIR for this signature: {exc}"}
        labels = identify(self.program, after)
        claimed = set(proposal.claimed_strategy.split(",")) if proposal.claimed_strategy else set()
        label = next((found for found in labels if found.strategy in claimed), labels[0] if labels else None)
        if label is not None:  # the state records the label, so the program is what the label gives: the
            # answer up to fresh names and cosmetic parentheses, and exactly what a replay of the state reaches
            outcome = self._evaluate(apply_action(self.program, label), label.text, verify=self._needs_check(label))
        else:
            outcome = self._evaluate(after, "leir:" + after.leir, verify=self._needs_check(None))
            outcome["identified"] = False
        outcome["claimed_strategy"] = proposal.claimed_strategy
        if claimed:  # an answer whose reasoning names one transformation and whose program does another
            outcome["claimed_strategy_matches"] = label is not None and label.strategy in claimed
        return outcome

    def _evaluate_action(self, action: Action) -> dict[str, Any]:
        try:
            after = apply_action(self.program, action)
        except StepTPError as exc:
            return {"error": f"{action.text} does not apply: {exc}"}
        return self._evaluate(after, action.text, verify=self._needs_check(action))

    def _needs_check(self, action: Action | None) -> bool:
        """Whether a step is verified even where it is not measured: every step with `verify_steps` (the
        default in `hybrid` mode, so that a reward paid on a prediction is still paid for a checked program),
        and in every mode a free-form rewrite (`action` None) and an action off the current program's
        candidate menu (a guard the analysis says is needed left out, a factor no menu offers): the bulk
        verification of the candidates does not cover those."""
        if self.verify_steps and self.mode != "measure":
            return True
        return action is None or action not in self.groups.get(action.strategy, ())

    def _evaluate(self, after: Program, text: str, verify: bool) -> dict[str, Any]:
        """Runtime (and, when asked, verification) of a proposed program; an `error` when it fails.
        `info["verified"]` says whether the program was checked against the workload in this step (every
        measured program is)."""
        if self.revisits != "allow" and canonical_text(after) in self._visited:
            if not text.startswith("leir:"):
                self._refused = self._refused | {Action.parse(text)}
            return {"error": f"{text[:200]} is masked out: it leads back to a program this episode already visited "
                             "or changes nothing (revisits='allow' permits it)", "action": text}
        checked = False
        if verify and self.mode != "measure":  # measuring verifies anyway
            check = measure(after, self.workload, self.target, self.oracle.protocol, timing=False)
            if not check.ok:
                return {"error": check.error or "verification failed", "action": text}
            checked = True
        # a measured program's candidates (the next state's menu) are enumerated while its kernel builds
        estimate = self.oracle.runtime(after, self.workload, self.best_s, self._scale,
                                       beside=lambda: self.catalog.groups(after, self.target, self.oracle.store))
        if estimate.runtime_s is None or estimate.error:
            return {"error": estimate.error or "no runtime", "action": text}
        checked = checked or estimate.measured  # a stored record was verified when it was measured
        outcome = {"program": after, "estimate": estimate, "action": text, "identified": True, "verified": checked}
        if estimate.measured and self.paired_rewards and self._anchor is not None:
            outcome.update(self._paired(after, estimate))
        if not checked:
            outcome["unverified"] = ("the reward is paid on a predicted runtime and the program was not checked "
                                     "in this step (verify_steps=False); its strategy's candidates are verified "
                                     "in bulk (benchmarks/strategies_verify.py), not this program")
        return outcome

    def _paired(self, after: Program, estimate: Estimate) -> dict[str, Any]:
        """The step's runtime from a paired timing against the episode's last measured program: that
        program's runtime divided by the measured speedup. When the paired run fails, the separate
        measurement stands and `info["paired"]` says why."""
        anchor, anchor_s = self._anchor
        extra: dict[str, Any] = {"measured_runtime_s": estimate.runtime_s}
        if anchor.leir == after.leir:
            return dict(extra, estimate=dataclasses.replace(estimate, runtime_s=anchor_s))
        pair = self.oracle.pair(anchor, after, self.workload)
        extra["paired"] = dict(pair.to_dict(), against="previous" if anchor is self.program else "last measured")
        if pair.error is not None:
            extra["paired"]["fallback"] = "the reward compares separately measured medians"
            return extra
        return dict(extra, estimate=dataclasses.replace(estimate, runtime_s=anchor_s / pair.ratio))

    def _calibrate(self, program: Program, estimate: Estimate) -> None:
        """Hybrid mode: after a measurement, rescale predictions so they agree with it here."""
        if self.mode == "hybrid" and estimate.measured and estimate.runtime_s:
            predicted = estimate.predicted_s or self.oracle.predict(program).predicted_s
            self._scale = estimate.runtime_s / predicted

    @property
    def groups(self) -> dict[str, list[Action]]:
        """Candidates of the current program by strategy (computed once per state). A measured program's
        lists go to the store with its runtime, so a replay in a fresh process finds both there."""
        if self._groups is None:
            store = self.oracle.store if self._estimate and self._estimate.measured else None
            self._groups = self.catalog.groups(self.program, self.target, store)
        return self._groups

    def action_masks(self) -> np.ndarray:
        """The legal indices of the current state (for sb3-contrib's MaskablePPO); stop is always legal."""
        if self.program is None:
            raise gym.error.ResetNeeded("call reset() before action_masks()")
        mask = self.catalog.mask(self.groups)
        for action in self._revisiting():
            index = self.catalog.encode(action, self.groups)
            if index is not None:
                mask[index] = False
        return mask

    def _revisiting(self) -> set[Action]:
        """Candidates of the current program known to lead back to a program of the episode: those refused
        in this state, and with revisits='mask' every one (each candidate applied)."""
        if self.revisits == "mask":
            return revisiting(self.program, self.groups, self._visited) | self._refused
        return set(self._refused)

    def action_text(self, index: int) -> str | None:
        """The action an index stands for in the current state (`stop`, or None when masked out)."""
        if index == STOP:
            return "stop"
        found = self.catalog.decode(int(index), self.groups)
        return None if found is None else found.text

    def candidate_texts(self) -> list[str]:
        """Every candidate action of the current program (also those beyond the catalog's slots), but those
        known to lead back to a program of the episode (see `revisits`)."""
        masked = self._revisiting()
        return [a.text for found in self.groups.values() for a in found if a not in masked]

    # -- observations and info -------------------------------------------------------------------------
    def _observation(self):
        if self.obs_mode == "text":
            return {"leir": self.program.leir, "signature": json.dumps(self.program.signature.to_json()),
                    "candidates": "\n".join(self.candidate_texts())}
        extra = np.array([self._steps / self.max_steps, math.log(self.initial_s / self.runtime_s),
                          math.log(self.runtime_s)], np.float32)
        features = np.concatenate([_squash(self.oracle.features(self.program).observation), extra])
        return {"features": np.clip(features, -100.0, 100.0).astype(np.float32),
                "action_mask": self.action_masks().astype(np.int8)}

    def _info(self, error: str | None, action: str | None, estimate: Estimate | None, **extra) -> dict[str, Any]:
        info = {"error": error, "action": action, "leir": self.program.leir,
                "signature": self.program.signature.to_json(), "candidates": self.candidate_texts(),
                "runtime_s": self.runtime_s, "initial_runtime_s": self.initial_s, "best_runtime_s": self.best_s,
                "speedup": self.initial_s / self.runtime_s, "step": self._steps, "workload": self.workload.uri}
        if estimate is not None:
            info.update(runtime_source=estimate.source, spread=estimate.spread)
            m = estimate.measurement
            if m is not None and m.verify is not None:
                info["verify"] = m.verify.to_dict()
                info["measure_phases_s"] = {"build": m.build_s, "verify": m.verify_s, "time": m.time_s}
            if m is not None and m.device is not None:
                info["device"] = m.device  # the RPC server that measured it
        info.update(extra)
        return info

    def render(self):
        if self.render_mode == "ansi":
            return (f"{self.workload.uri} step {self._steps}: {self.runtime_s * 1e3:.3f} ms "
                    f"(x{self.initial_s / self.runtime_s:.2f})\n{self.program.leir}\n")
        return None

    # -- state, replay, validation, forking ------------------------------------------------------------
    @property
    def state(self) -> EnvState:
        """The episode so far (a copy): replay it with `apply`, check it with `validate`."""
        if self._state is None:
            raise gym.error.ResetNeeded("call reset() first")
        return copy.deepcopy(self._state)

    def _replay_program(self, state: EnvState) -> list[Program]:
        program = self._load(state.workload).program
        chain = [program]
        for text in state.actions:
            if text.startswith("leir:"):
                program = Program.parse(text[len("leir:"):], program.signature)
            else:
                program = apply_action(program, text)
            chain.append(program)
        return chain

    def apply(self, state: EnvState) -> None:
        """Reset to the state's workload and replay its actions through `step` (rewards recomputed)."""
        self._check_compatible(state)
        self.reset(options={"workload": state.workload})
        for text in state.actions:
            info = self._replay_step(text)
            if info["error"]:
                raise StepTPError(f"replay failed at {text}: {info['error']}")

    def _replay_step(self, text: str) -> dict[str, Any]:
        """One recorded action (an action text, or `leir:` and a free-form rewrite) through `step`."""
        payload = text if not text.startswith("leir:") else json.dumps({"transformed_IR": text[5:]})
        return self.step(payload)[4]

    def validate(self, state: EnvState | None = None) -> dict[str, Any]:
        """Replay `state` (default: the current episode), verify every program of it against the workload's
        reference, and re-measure the final one, its speedup over the start timed paired (interleaved).
        Returns {"ok", "errors", "final_leir", "runtime_s", "speedup", "speedup_interval"}."""
        state = state or self.state
        self._check_compatible(state)
        workload = self._load(state.workload)
        errors = []
        try:
            chain = self._replay_program(state)
        except StepTPError as exc:
            return {"ok": False, "errors": [f"replay: {exc}"], "final_leir": None, "runtime_s": None, "speedup": None}
        for number, program in enumerate(chain[1:], 1):
            check = measure(program, workload, self.target, self.oracle.protocol, timing=False)
            if not check.ok:
                errors.append(f"step {number} ({state.actions[number - 1][:80]}): {check.error}")
        first = measure(chain[0], workload, self.target, self.oracle.protocol)
        final = measure(chain[-1], workload, self.target, self.oracle.protocol)
        if not final.ok:
            errors.append(f"final program: {final.error}")
        speedup = interval = None
        if first.ok and final.ok and chain[-1].leir == chain[0].leir:  # the start itself: x1 by definition
            speedup, interval = 1.0, [1.0, 1.0]
        elif first.ok and final.ok:  # the speedup from a paired timing; separate medians where that fails
            pair = measure_pair(chain[0], chain[-1], workload, self.target, self.oracle.protocol)
            speedup = pair.ratio if pair.error is None else first.median_s / final.median_s
            interval = [pair.low, pair.high] if pair.error is None else None
        return {"ok": not errors, "errors": errors, "final_leir": chain[-1].leir, "runtime_s": final.median_s,
                "speedup": speedup, "speedup_interval": interval}

    def _check_compatible(self, state: EnvState) -> None:
        if state.workload not in self._workloads and self._fixed is None and state.workload not in list_workloads():
            raise ValueError(f"state workload {state.workload!r} is not in the suite; make the env with that "
                             "workload: its saved folder as the workload (Workload.save), or the Workload itself")
        if (state.target, state.dtype) != (self.target, self.dtype):
            raise ValueError(f"state is for target={state.target}, dtype={state.dtype}; this env has "
                             f"target={self.target}, dtype={self.dtype}")

    def fork(self) -> StepTPEnv:
        """An independent copy of this env in its current state, sharing the store and the cost model."""
        twin = copy.copy(self)
        twin._state = copy.deepcopy(self._state)
        twin._workloads = self._workloads  # read-only after loading
        twin._np_random = copy.deepcopy(self._np_random)
        return twin

    def close(self) -> None:
        super().close()
