"""Environment step latency in each runtime mode, at `small`, next to CompilerGym's published figures.

For each workload a fixed, seeded sequence of legal actions is stepped three ways: `measure` with an
empty store (every step builds, verifies and times), the same sequence again in a new env on that store
(every step a store hit), and `model` (cost-model prediction). A step includes everything a policy waits
for: applying the action, the runtime, and the next observation (features and action mask).
Writes benchmarks/results/step_latency.md.

    python benchmarks/step_latency.py [--steps 20] [--workloads level1/matmul,level1/softmax]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = "level1/matmul,level1/softmax,level1/conv2d,level1/layer_norm,level2/gemm_relu_divide"
COMPILERGYM = "CompilerGym (Cummins et al. 2022): 0.31 ms per step for its fast LLVM environment, 66 ms for its slow one"


def episode(env: StepTPEnv, uri: str, actions: list[int] | None, steps: int, seed: int) -> tuple[list[float], list[int]]:
    """Step `actions` (or seeded random legal ones); return the step latencies and the actions taken."""
    env.reset(seed=seed, options={"workload": uri})
    rng = np.random.default_rng(seed)
    taken, latencies = [], []
    for number in range(steps):
        if actions is not None:
            if number >= len(actions):
                break
            action = actions[number]
        else:
            legal = np.flatnonzero(env.action_masks()[1:]) + 1
            action = int(rng.choice(legal))
        start = time.perf_counter()
        _, _, _, _, info = env.step(action)
        latencies.append(time.perf_counter() - start)
        if info["error"] is None:
            taken.append(action)
    return latencies, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workloads", default=WORKLOADS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    uris = args.workloads.split(",")
    protocol = Protocol(threads=args.threads)
    times: dict[str, list[float]] = {"measure (build, verify, time)": [], "store hit": [], "model": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store.sqlite"
        kwargs = dict(preset="small", store=store, protocol=protocol, max_steps=10 ** 6)
        measured = StepTPEnv(uris, mode="measure", **kwargs)
        model = StepTPEnv(uris, mode="model", **kwargs)
        for seed, uri in enumerate(uris):
            latencies, taken = episode(measured, uri, None, args.steps, seed)
            times["measure (build, verify, time)"] += latencies
            replay = StepTPEnv(uris, mode="measure", **kwargs)  # a fresh oracle: only the store knows them
            times["store hit"] += episode(replay, uri, taken, args.steps, seed)[0]
            times["model"] += episode(model, uri, taken, args.steps, seed)[0]
    targets = {"measure (build, verify, time)": 150, "store hit": 5, "model": 30}
    lines = ["# Environment step latency (`small`)", "",
             f"{len(uris)} workloads ({', '.join(uris)}), {args.steps} seeded random legal steps each; protocol "
             f"threads={protocol.threads}; load average {os.getloadavg()[0]:.2f}. {COMPILERGYM}.", "",
             "| mode | steps | median ms | p90 ms | steps/s | target median |", "|---|---|---|---|---|---|"]
    for mode, values in times.items():
        values = sorted(values)
        median = statistics.median(values)
        lines.append(f"| {mode} | {len(values)} | {median * 1e3:.1f} | {values[int(0.9 * len(values))] * 1e3:.1f} | "
                     f"{len(values) / sum(values):.1f} | < {targets[mode]} ms |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "step_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
