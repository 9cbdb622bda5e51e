"""Can a policy trained on model-mode rewards be trusted? The issue-17 PPO figure.

    PYTHONPATH=. python benchmarks/ppo_model_mode.py [--timesteps 10000] [--uncertainty-penalty 0 1]
        [--learning-rate 3e-4] [--ent-coef 0.0] [--gamma 0.99] [--preset tiny] [--out name]

MaskablePPO (`agents.ppo.train`, seed 0) is trained for `--timesteps` steps in model mode on a fixed small
training set (TRAINING, at `--preset`, tiny by default; episodes of at most 8 steps; the packaged cost model,
trained on measurements at small; one thread), once per
`--uncertainty-penalty` value. Then its greedy episode on every training workload is replayed, each program
verified, and the final program timed paired against the start program (`StepTPEnv.validate`): the speedup
the rewards claimed (exp of the episode's return) against the measured one. Targets (issue 17): measured
>= 1.0 on every workload and within 20% of the claimed speedup.

Writes benchmarks/results/ppo_model_mode.md and .json (ppo_model_mode_<out>.* with `--out`).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from agents.ppo import measured_finals, policy_of, train
from steptp_env.env import StepTPEnv

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = ["level1/matmul", "level1/softmax", "level1/conv2d", "level1/layer_norm", "level2/gemm_relu_divide"]


def one_run(timesteps: int, penalty: float, store: Path, hyper: dict, preset: str) -> dict:
    env = StepTPEnv(TRAINING, preset, mode="model", max_steps=8, store=store, uncertainty_penalty=penalty)
    start = time.perf_counter()
    model = train(env, timesteps, seed=0, **hyper)
    trained_s = time.perf_counter() - start
    rows = []
    for uri in TRAINING:  # one deterministic episode per workload: model mode and a greedy policy
        alone = StepTPEnv(uri, preset, mode="model", max_steps=8, store=store, uncertainty_penalty=penalty)
        rows += measured_finals(policy_of(model), alone, [0])
    for row in rows:
        measured = row["measured"]
        row["within_20pct"] = measured is not None and abs(measured / row["claimed"] - 1) <= 0.2
        row["at_least_1"] = measured is not None and measured >= 1.0
    return {"uncertainty_penalty": penalty, "timesteps": timesteps, "train_s": trained_s, "rows": rows,
            "load": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=10_000)
    parser.add_argument("--uncertainty-penalty", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="PPO's step size (SB3's default)")
    parser.add_argument("--ent-coef", type=float, default=0.0, help="entropy bonus (SB3's default: none)")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount (1.0: the return is the log of the "
                        "episode's whole claimed speedup)")
    parser.add_argument("--preset", default="tiny", help="workload sizes (the packaged cost model was trained "
                        "on measurements at small)")
    parser.add_argument("--out", default="", help="suffix of the result files")
    args = parser.parse_args()
    hyper = {"learning_rate": args.learning_rate, "ent_coef": args.ent_coef, "gamma": args.gamma}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for penalty in args.uncertainty_penalty:
            runs.append(one_run(args.timesteps, penalty, Path(tmp) / "store.sqlite", hyper, args.preset))
            print(json.dumps(runs[-1], indent=1), flush=True)
    lines = ["# PPO trained on model-mode rewards, its final programs measured", "",
             f"`PYTHONPATH=. python benchmarks/ppo_model_mode.py --timesteps {args.timesteps} "
             f"--uncertainty-penalty {' '.join(map(str, args.uncertainty_penalty))} --learning-rate "
             f"{args.learning_rate} --ent-coef {args.ent_coef} --gamma {args.gamma}"
             + (f" --preset {args.preset}" if args.preset != "tiny" else "")
             + (f" --out {args.out}" if args.out else "") + "`; training set "
             f"{', '.join(TRAINING)} at `{args.preset}`, 8 steps per episode, seed 0, one thread; measured = the final "
             f"program timed paired against the start (`StepTPEnv.validate`); {os.cpu_count()} CPUs.", "",
             "| uncertainty penalty | workload | actions | claimed | measured (95% interval) | measured/claimed | "
             ">= 1.0 | within 20% |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for row in run["rows"]:
            measured = row["measured"]
            low_high = row.get("interval") or [None, None]
            shown = "-" if measured is None else f"x{measured:.3f}" + (
                f" ({low_high[0]:.3f}-{low_high[1]:.3f})" if low_high[0] else "")
            ratio = "-" if measured is None else f"{measured / row['claimed']:.2f}"
            lines.append(f"| {run['uncertainty_penalty']} | {row['workload']} | {len(row['actions'])} | "
                         f"x{row['claimed']:.3f} | {shown} | {ratio} | {'yes' if row['at_least_1'] else 'no'} | "
                         f"{'yes' if row['within_20pct'] else 'no'} |")
        lines.append(f"| {run['uncertainty_penalty']} | all | trained {run['train_s']:.0f} s | | | | "
                     f"{sum(r['at_least_1'] for r in run['rows'])}/{len(run['rows'])} | "
                     f"{sum(r['within_20pct'] for r in run['rows'])}/{len(run['rows'])} |")
    lines += ["", f"Load average (1, 5, 15 min) at the end of each run: "
                  + "; ".join(", ".join(f"{x:.2f}" for x in run["load"]) for run in runs) + "."]
    RESULTS.mkdir(exist_ok=True)
    stem = f"ppo_model_mode_{args.out}" if args.out else "ppo_model_mode"
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
