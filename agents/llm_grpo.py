"""RL on the environment's reward: TRL's `GRPOTrainer` with a reward function that is an environment step.

Prompts are states of the training workloads (each start program and the programs a few seeded random steps
away, `prompt_states`), asked in the answer style of `agents.llm`. Each completion is stepped in text mode
on a fork of an env standing at the prompt's state: the environment parses it, identifies the strategy,
verifies the program and times it (or predicts it, by `mode`), and the step's reward is the completion's:
the log speedup, or the env's penalty for an answer that does not parse, apply or verify. A bounded run
writes the policy, `reward.png` and `train_log.json`.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steptp_env.data.prompts import SYSTEM_PROMPT, action_prompt, candidate_menu, step_prompt
from steptp_env.env import StepTPEnv
from steptp_env.strategies import apply_action, candidates


@dataclass(frozen=True)
class GRPOOptions:
    """`prompts` states in all, `generations` completions per prompt, `max_steps` optimiser steps. With
    `pool`, the run asks the start programs of `pool` workloads spread over the list, in a fixed cycle
    (no shuffling): every window of `pool` prompts is the same questions, so the mean reward of the first
    and the last windows differ by what the policy learned, not by which programs were drawn. `min_p`
    samples only tokens at least that fraction as likely as the likeliest one: at temperature 0.9 without
    it, the third acceptance run's completions drifted into strategy names that no menu lists
    (`loop_reordering`), each paid the illegal-answer penalty, so the invalid answers' count, not the
    choice among the menu's actions, decided the mean reward."""

    style: str = "action"
    candidates: int = 32
    walk: int = 2
    max_steps: int = 20
    minutes: float | None = None
    generations: int = 4
    prompts_per_step: int = 2
    max_completion_length: int = 64
    learning_rate: float = 1e-5
    temperature: float = 0.9
    min_p: float | None = 0.1
    mode: str = "hybrid"
    preset: str = "tiny"
    seed: int = 0
    pool: int | None = None


def prompt_states(workloads: list[str], options: GRPOOptions, count: int) -> list[dict[str, Any]]:
    """`count` rows (prompt messages, workload, actions reaching the state), cycling over `workloads`: the
    start program, then programs reached by up to `options.walk` seeded random candidate steps."""
    from steptp_env.workloads import get_workload

    rng = random.Random(options.seed)
    starts = {uri: get_workload(uri, options.preset).program for uri in workloads}
    rows = []
    for n in range(count):
        uri = workloads[n % len(workloads)]
        program, actions = starts[uri], []
        for _ in range(rng.randint(0, options.walk) if n >= len(workloads) else 0):
            found = candidates(program)
            if not found:
                break
            action = found[rng.randrange(len(found))]
            program, actions = apply_action(program, action), actions + [action.text]
        if options.style == "ir":
            user = step_prompt(program, uri)
        else:
            texts = [a.text for a in candidates(program)]
            menu = candidate_menu(texts, options.candidates) if options.candidates else None
            user = action_prompt(program, uri, menu)
        rows.append({"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
                     "workload": uri, "actions": actions})
    return rows


class EnvReward:
    """A TRL reward function: each completion's reward is a step of a text-mode env at the prompt's state.
    Envs are kept per (workload, state) and forked per completion, so one completion never sees another's
    step; the step's info of every call is kept in `log` (parsed, identified, verified, speedup, error)."""

    __name__ = "env_reward"

    def __init__(self, mode: str = "hybrid", preset: str = "tiny", store: Path | str | None = None) -> None:
        self.mode, self.preset, self.store = mode, preset, store
        self._states: dict[tuple[str, tuple[str, ...]], StepTPEnv] = {}
        self.log: list[dict[str, Any]] = []

    def _at(self, workload: str, actions: tuple[str, ...]) -> StepTPEnv:
        key = (workload, actions)
        if key not in self._states:
            env = StepTPEnv(workload, self.preset, mode=self.mode, action_mode="text", obs_mode="text",
                            store=self.store)
            env.reset(seed=0)
            for action in actions:
                env.step(action)
            self._states[key] = env
        return self._states[key]

    def __call__(self, prompts, completions, workload, actions, **_: Any) -> list[float]:
        rewards = []
        for completion, uri, reached in zip(completions, workload, actions):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            fork = self._at(uri, tuple(reached)).fork()
            _, reward, _, _, info = fork.step(text)
            rewards.append(float(reward))
            self.log.append({"workload": uri, "reward": float(reward), "error": info.get("error"),
                             "action": info.get("action"), "speedup": None if info.get("error") else info["speedup"],
                             "verified": info.get("verified")})
        return rewards


def grpo(workloads: list[str], out: Path | str, model: str | Path | None = None,
         options: GRPOOptions = GRPOOptions(), store: Path | str | None = None) -> Path:
    """A bounded GRPO run on `workloads`; the policy, `reward.png` and `train_log.json` go to `out`."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from .llm import load_transformers
    from .llm_train import plot_curve, time_limit

    out = Path(out)
    loaded, tokenizer = load_transformers(model)
    count = options.max_steps * options.prompts_per_step
    if options.pool:
        spread = workloads[::max(1, len(workloads) // options.pool)][:options.pool]
        pool = prompt_states(spread, options, len(spread))
        states = [pool[n % len(pool)] for n in range(count)]
    else:
        states = prompt_states(workloads, options, count)
    data = Dataset.from_list(states)
    config = GRPOConfig(output_dir=str(out / "trainer"), max_steps=options.max_steps,
                        per_device_train_batch_size=options.prompts_per_step * options.generations,
                        num_generations=options.generations, max_completion_length=options.max_completion_length,
                        learning_rate=options.learning_rate, temperature=options.temperature, min_p=options.min_p,
                        logging_steps=1,
                        save_strategy="no", report_to=[], use_cpu=True, seed=options.seed, bf16=False,
                        disable_tqdm=True, shuffle_dataset=not options.pool)
    # TRL's gradient checkpointing stays on here (unlike SFT's batch of one row): without it a step's
    # `generations` completions of a long prompt kept every activation, and one run reached 24 GB
    reward = EnvReward(options.mode, options.preset, store)
    trainer = GRPOTrainer(model=loaded, reward_funcs=[reward], args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[time_limit(options.minutes, "reward")])
    began = time.monotonic()
    trainer.train()
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    history = trainer.state.log_history
    (out / "train_log.json").write_text(json.dumps({"options": asdict(options), "workloads": workloads,
                                                    "seconds": time.monotonic() - began, "history": history,
                                                    "steps": reward.log}, indent=1) + "\n")
    plot_curve(history, "reward", out / "reward.png", f"GRPO on {len(workloads)} workloads ({options.mode} mode)")
    return out
