"""How much does the reward of one fixed step move on a busy machine? The issue-17 noise figure.

    PYTHONPATH=. python benchmarks/reward_noise.py [--repeats 10] [--busy 2] [--threads 1]

For each fixed step (a workload at `small` and one action text), `--repeats` times: a fresh store, a
measure-mode env (protocol at `--threads`), `reset` (the start program measured) and the step; the reward
is recorded. Every repeat runs the step twice, interleaved: with paired rewards (the new program timed
interleaved with the previous one until the ratio's 95% interval is within +-3%, the default) and without
(the ratio of two separate medians, the environment's reward before 0.4). `--busy` processes spin on the
CPUs throughout (pure Python loops, started before the first repeat and stopped after the last), so the
figure is the one a user gets with other work on the machine. The standard deviation of each step's
rewards over the repeats is the noise (0.03 ~ 3% in speedup).

Writes benchmarks/results/reward_noise.md and .json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = [("level1/matmul_square", "loop_reorder(nest=0, order=[a,d,c])"),
         ("level1/softmax", "loop_split(nest=0, loop=a, factor=2)"),
         ("level1/conv2d", "loop_unrolling(nest=0, loop=h)")]
MODES = {"paired": True, "separate medians": False}


def spin() -> None:
    """A busy neighbour: one CPU's worth of pure Python work until terminated."""
    x = 0
    while True:
        x = (x + 1) % 1_000_003


def one_reward(uri: str, action: str, threads: int, paired: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = StepTPEnv(uri, preset="small", mode="measure", store=Path(tmp) / "store.sqlite",
                        protocol=Protocol(threads=threads), paired_rewards=paired)
        env.reset(seed=0)
        start = time.perf_counter()
        _, reward, _, _, info = env.step(action)
        if info["error"]:
            raise SystemExit(f"{uri}: {action} failed: {info['error']}")
        row = {"reward": reward, "step_s": time.perf_counter() - start, "load": os.getloadavg()[0]}
        if paired:
            row.update(rounds=info["paired"]["rounds"], converged=info["paired"]["converged"],
                       interval=[info["paired"]["low"], info["paired"]["high"]])
        env.close()
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    rows: dict[str, dict[str, list[dict]]] = {uri: {mode: [] for mode in MODES} for uri, _ in STEPS}
    try:
        for repeat in range(args.repeats):
            for uri, action in STEPS:
                for mode, paired in (MODES.items() if repeat % 2 == 0 else reversed(MODES.items())):
                    rows[uri][mode].append(one_reward(uri, action, args.threads, paired))
                    print(uri, mode, repeat, f"{rows[uri][mode][-1]['reward']:.4f}", flush=True)
    finally:
        for process in busy:
            process.terminate()
    report(rows, args)


def report(rows: dict, args: argparse.Namespace) -> None:
    loads = [r["load"] for by_mode in rows.values() for found in by_mode.values() for r in found]
    lines = ["# Reward noise on a busy machine", "",
             f"`PYTHONPATH=. python benchmarks/reward_noise.py --repeats {args.repeats} --busy {args.busy} "
             f"--threads {args.threads}`: each step's reward on a fresh store, {args.repeats} times, with "
             f"{args.busy} busy processes spinning; protocol threads={args.threads}; {os.cpu_count()} CPUs; "
             f"load average (1 min) {min(loads):.2f}-{max(loads):.2f}.", "",
             "| workload (small) | step | rewards | mean | std | exp(mean) | paired rounds | intervals met |",
             "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for uri, action in STEPS:
        for mode in MODES:
            found = rows[uri][mode]
            rewards = [r["reward"] for r in found]
            std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
            summary[f"{uri} {mode}"] = std
            rounds = (f"{min(r['rounds'] for r in found)}-{max(r['rounds'] for r in found)}"
                      if mode == "paired" else "-")
            met = f"{sum(r['converged'] for r in found)}/{len(found)}" if mode == "paired" else "-"
            lines.append(f"| {uri} | `{action}` {mode} | {len(rewards)} | {statistics.mean(rewards):.4f} | "
                         f"{std:.4f} | {2.718281828 ** statistics.mean(rewards):.3f} | {rounds} | {met} |")
    lines += ["", "std = sample standard deviation of the rewards (log speedups); target <= 0.03 with pairing."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "reward_noise.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "reward_noise.json").write_text(json.dumps({"args": vars(args), "rows": rows, "std": summary},
                                                          indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
