"""PPO with invalid-action masking (sb3-contrib's `MaskablePPO`) on the index-mode env.

The policy reads the observation's feature vector and legal-action mask and picks a catalog index; the
mask keeps it on legal actions, so what it learns is which strategy and site pay off, and when to stop.
Train, compare with the random policy and with stopping at once, and measure the trained policy's final
programs against the speedups its rewards claimed, from the command line:

    python -m agents.ppo -w level1/matmul -w level1/softmax --preset tiny --mode model \
        --timesteps 5000 --out ppo.zip [--tensorboard tb/]
"""
from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import typer
from sb3_contrib import MaskablePPO

from steptp_env.env import STOP, EnvState, StepTPEnv

from .common import AgentResult, Search
from .random_search import Policy, random_policy


def train(env: StepTPEnv, timesteps: int, seed: int = 0, n_steps: int = 256, batch_size: int = 64,
          n_epochs: int = 4, threads: int = 1, verbose: int = 0, tensorboard: Path | str | None = None,
          **ppo_kwargs: Any) -> MaskablePPO:
    """Train a `MultiInputPolicy` for `timesteps` env steps. `threads` sets torch's (process-wide) thread
    count: the networks are tiny, and more threads only contend with the cost model and the measurements.
    `verbose=1` prints SB3's training log after every rollout; `tensorboard` is a folder for its
    TensorBoard logs (the `tensorboard` package, in the `[rl]` extra)."""
    if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--tensorboard needs the tensorboard package: pip install tensorboard (or the [rl] extra)")
    torch.set_num_threads(threads)
    n_steps = max(2, min(n_steps, timesteps))
    model = MaskablePPO("MultiInputPolicy", env, n_steps=n_steps, batch_size=min(batch_size, n_steps),
                        n_epochs=n_epochs, seed=seed, device="cpu", verbose=verbose,
                        tensorboard_log=None if tensorboard is None else str(tensorboard), **ppo_kwargs)
    return model.learn(timesteps)


def policy_of(model: MaskablePPO) -> Policy:
    """The trained policy as `(obs, mask) -> action`, acting on its most likely legal action."""
    return lambda obs, mask: int(model.predict(obs, action_masks=mask, deterministic=True)[0])


def evaluate(policy: Policy, env: StepTPEnv, seeds: Iterable[int]) -> list[float]:
    """The return of one episode per seed (the seed also picks the workload of a multi-workload env)."""
    return [_episode(policy, env, seed)[0] for seed in seeds]


def _episode(policy: Policy, env: StepTPEnv, seed: int) -> tuple[float, EnvState]:
    """(return, final state) of one episode of `policy`."""
    unwrapped = env.unwrapped
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs, unwrapped.action_masks()))
        total += reward
        done = terminated or truncated
    return total, unwrapped.state


def measured_finals(policy: Policy, env: StepTPEnv, seeds: Iterable[int]) -> list[dict]:
    """One episode per seed, its final program then replayed, verified and measured beside the start
    program (`StepTPEnv.validate`, the env's protocol): what a policy trained on predicted rewards really
    achieved. Each row: workload, actions, the speedup the rewards claimed (exp of the return) and the
    measured one, timed paired with its 95% interval (None, with the errors, when validation failed)."""
    rows = []
    for seed in seeds:
        total, state = _episode(policy, env, seed)
        check = env.unwrapped.validate(state)
        rows.append({"workload": state.workload, "actions": list(state.actions), "claimed": math.exp(total),
                     "measured": check["speedup"], "interval": check["speedup_interval"], "errors": check["errors"]})
    return rows


def describe_finals(rows: list[dict]) -> str:
    """A table of claimed against measured speedups, with stopping at once (x1 by definition) beside."""
    lines = ["workload | actions | claimed | measured | measured/claimed"]
    for row in rows:
        measured = row["measured"]
        ratio = "-" if measured is None else f"{measured / row['claimed']:.2f}"
        shown = "-" if measured is None else f"x{measured:.3f}"
        lines.append(f"{row['workload']} | {len(row['actions'])} | x{row['claimed']:.3f} | {shown} | {ratio}")
    kept = [r["measured"] for r in rows if r["measured"] is not None]
    if kept:
        lines.append(f"geometric mean measured x{statistics.geometric_mean(kept):.3f} over {len(kept)} episodes; "
                     f"stopping at once: x1.000 (return 0)")
    return "\n".join(lines)


def run(env: StepTPEnv, budget: int, seed: int, *, policy: MaskablePPO | Path | str | None = None) -> AgentResult:
    """One greedy episode of `policy` (a model or a saved .zip) within `budget`. Without a policy, first
    trains one on `env` for `budget` timesteps; the episode then gets `max_steps` units of its own."""
    unwrapped = env.unwrapped
    if unwrapped.action_mode != "index" or unwrapped.obs_mode != "vector":
        raise ValueError("PPO needs action_mode='index' and obs_mode='vector'")
    if policy is None:
        policy, budget = train(env, budget, seed), unwrapped.max_steps
    elif not isinstance(policy, MaskablePPO):
        policy = MaskablePPO.load(policy, device="cpu")
    act = policy_of(policy)
    search = Search(env, budget, seed, "ppo")
    node = search.root()
    while node is not None and node.depth < search.max_depth and not search.exhausted:
        action = act(node.obs, node.env.action_masks())
        if action == STOP:
            break
        move = next(m for m in search.moves(node) if m.action == action)
        node = search.step(node, move, fork=False)  # a deterministic policy would repeat a failing action
    return search.result()


def main(workload: list[str] = typer.Option(["level1/matmul"], "--workload", "-w", help="suite URIs or globs"),
         preset: str = typer.Option("tiny", help="tiny, small or default"),
         mode: str = typer.Option("model", help="measure, model or hybrid"),
         timesteps: int = typer.Option(5000, help="training env steps"),
         max_steps: int = typer.Option(8, help="steps per episode"),
         seed: int = typer.Option(0),
         episodes: int = typer.Option(10, help="evaluation episodes, against the random policy on the same seeds"),
         store: Optional[Path] = typer.Option(None, help="result store (default: the user cache)"),
         out: Path = typer.Option(Path("ppo.zip"), help="where to save the trained model"),
         tensorboard: Optional[Path] = typer.Option(None, help="write TensorBoard logs to this folder"),
         quiet: bool = typer.Option(False, help="leave out SB3's training log")) -> None:
    """Train MaskablePPO (SB3's training log printed after every rollout), save it, compare its mean
    return with the random policy's and with stopping at once, then measure its final programs against
    what the rewards claimed."""
    env = StepTPEnv(workload if len(workload) > 1 else workload[0], preset, mode=mode, max_steps=max_steps,
                    store=store)
    try:
        model = train(env, timesteps, seed, verbose=0 if quiet else 1, tensorboard=tensorboard)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    model.save(out)
    seeds = range(seed + 1, seed + 1 + episodes)
    trained = statistics.mean(evaluate(policy_of(model), env, seeds))
    baseline = statistics.mean(evaluate(random_policy(seed), env, seeds))
    print(f"saved {out}; mean return over {episodes} episodes: ppo {trained:.3f}, random {baseline:.3f}, "
          "stopping at once 0.000")
    print("the policy's final programs, measured:")
    print(describe_finals(measured_finals(policy_of(model), env, seeds)))


if __name__ == "__main__":
    typer.run(main)
