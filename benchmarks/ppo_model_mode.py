"""Can a policy trained on model-mode rewards be trusted? The issue-17 PPO figure.

    PYTHONPATH=. python benchmarks/ppo_model_mode.py [--timesteps 10000] [--uncertainty-penalty 0 1]
        [--learning-rate 3e-4] [--ent-coef 0.0] [--gamma 0.99] [--preset tiny] [--model DIR]
        [--model-store PATH [--rounds R] [--episodes 20]] [--out name]

MaskablePPO (`agents.ppo.train`, seed 0) is trained for `--timesteps` steps in model mode on a fixed small
training set (TRAINING, at `--preset`, tiny by default; episodes of at most 8 steps; one thread), once per
`--uncertainty-penalty` value. Then its greedy episode on every training workload is replayed, each program
verified, and the final program timed paired against the start program (`StepTPEnv.validate`): the speedup
the rewards claimed (exp of the episode's return) against the measured one. Targets (issue 17): measured
>= 1.0 on every workload and within 20% of the claimed speedup.

The cost model: the packaged one (trained on measurements at small), a saved one (`--model`), or one fitted
on a result store's measurements (`--model-store`, e.g. `costmodel_eval.py --preset tiny`'s collection).
With a store, `--rounds` rounds of data aggregation come first: PPO is trained on the current model, the
programs its episodes visit (`--episodes` per workload, the first greedy, the rest sampled) are measured
into the store, and the model is fitted again; the reported run is then trained on the last model. A
model-mode policy exploits whatever the model gets wrong on the programs it reaches; measuring those
programs is how the model learns them (the store is extended in place).

Writes benchmarks/results/ppo_model_mode.md and .json (ppo_model_mode_<out>.* with `--out`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sb3_contrib import MaskablePPO

from agents.ppo import measured_finals, policy_of, train
from steptp_env.costmodel.dataset import measure_into
from steptp_env.costmodel.dataset import train as train_cost_model
from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol, ResultStore
from steptp_env.workloads import get_workload

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = ["level1/matmul", "level1/softmax", "level1/conv2d", "level1/layer_norm", "level2/gemm_relu_divide"]


def model_note(directory: Path) -> str:
    """What a saved cost model says it was trained on, for the results file."""
    meta = json.loads((directory / "model.json").read_text())
    return (f"{meta.get('trained_on') or str(meta['samples']) + ' programs'}, protocol {meta.get('protocol')}, "
            f"preset {meta.get('preset', 'unrecorded')}")


def training_env(preset: str, penalty: float, store: Path, cost_model: Path | None, uri=TRAINING) -> StepTPEnv:
    return StepTPEnv(uri, preset, mode="model", max_steps=8, store=store, uncertainty_penalty=penalty,
                     model=cost_model)


def one_run(timesteps: int, penalty: float, store: Path, hyper: dict, preset: str, cost_model: Path | None) -> dict:
    start = time.perf_counter()
    model = train(training_env(preset, penalty, store, cost_model), timesteps, seed=0, **hyper)
    trained_s = time.perf_counter() - start
    rows = []
    for uri in TRAINING:  # one deterministic episode per workload: model mode and a greedy policy
        rows += measured_finals(policy_of(model), training_env(preset, penalty, store, cost_model, uri), [0])
    for row in rows:
        measured = row["measured"]
        row["within_20pct"] = measured is not None and abs(measured / row["claimed"] - 1) <= 0.2
        row["at_least_1"] = measured is not None and measured >= 1.0
    return {"uncertainty_penalty": penalty, "timesteps": timesteps, "train_s": trained_s, "rows": rows,
            "load": os.getloadavg()}


def fit_cost_model(cost_store: Path, preset: str, out: Path) -> Path:
    """A cost model of every program measured in `cost_store` (of one protocol), saved to `out`."""
    with ResultStore(cost_store) as store:
        model = train_cost_model(store)
    model.meta.update(preset=preset)
    return model.save(out)


def aggregate(policy: MaskablePPO, cost_store: Path, preset: str, penalty: float, cost_model: Path,
              episodes: int, scratch: Path) -> int:
    """Data aggregation: the programs `episodes` episodes of `policy` visit on every training workload (the
    first greedy, the others sampled from the policy) are measured into `cost_store` at one thread, so
    that the next model knows the programs this policy reaches; returns how many were new."""
    protocol, written = Protocol(threads=1), 0
    with ResultStore(cost_store) as store:
        for uri in TRAINING:
            env, workload = training_env(preset, penalty, scratch, cost_model, uri), get_workload(uri, preset)
            name = workload.uri
            store.add_workload(name, workload.program, preset)
            for episode in range(episodes):
                obs, _ = env.reset(seed=episode)
                done = False
                while not done:
                    action = policy.predict(obs, action_masks=env.action_masks(), deterministic=episode == 0)[0]
                    obs, _, terminated, truncated, _ = env.step(int(action))
                    done = terminated or truncated
                    written += measure_into(store, name, env.program, workload, protocol)
    return written


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
    parser.add_argument("--model", type=Path, default=None, help="a saved cost model (default: the packaged one)")
    parser.add_argument("--model-store", type=Path, default=None, help="train the cost model on this result "
                        "store's measurements instead (e.g. costmodel_eval.py's collection at the preset)")
    parser.add_argument("--rounds", type=int, default=0, help="with --model-store: data-aggregation rounds "
                        "before the reported run (train PPO, measure what it visits into the store, refit)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per workload measured in a round")
    parser.add_argument("--out", default="", help="suffix of the result files")
    args = parser.parse_args()
    if args.rounds and args.model_store is None:
        parser.error("--rounds needs --model-store (the store the measured programs go into)")
    hyper = {"learning_rate": args.learning_rate, "ent_coef": args.ent_coef, "gamma": args.gamma}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "store.sqlite"
        for penalty in args.uncertainty_penalty:
            added = []
            for round_ in range(args.rounds):
                cost_model = fit_cost_model(args.model_store, args.preset, Path(tmp) / f"model_{penalty}_{round_}")
                policy = train(training_env(args.preset, penalty, scratch, cost_model), args.timesteps, seed=0,
                               **hyper)
                added.append(aggregate(policy, args.model_store, args.preset, penalty, cost_model, args.episodes,
                                       scratch))
                print(f"penalty {penalty}, round {round_}: {added[-1]} programs measured into the store", flush=True)
            cost_model = (fit_cost_model(args.model_store, args.preset, Path(tmp) / f"model_{penalty}")
                          if args.model_store else args.model)
            runs.append(one_run(args.timesteps, penalty, scratch, hyper, args.preset, cost_model))
            runs[-1].update(aggregated=added, cost_model=None if cost_model is None else model_note(cost_model))
            print(json.dumps(runs[-1], indent=1), flush=True)
    lines = ["# PPO trained on model-mode rewards, its final programs measured", "",
             f"`PYTHONPATH=. python benchmarks/ppo_model_mode.py {' '.join(sys.argv[1:])}`; training set "
             f"{', '.join(TRAINING)} at `{args.preset}`, 8 steps per episode, seed 0, one thread; measured = the "
             f"final program timed paired against the start (`StepTPEnv.validate`); {os.cpu_count()} CPUs.", ""]
    for run in runs:
        lines.append(f"- Penalty {run['uncertainty_penalty']}: cost model "
                     + (f"trained on {run['cost_model']}" if run["cost_model"] else "the packaged one")
                     + (f"; data-aggregation rounds measured {', '.join(map(str, run['aggregated']))} new "
                        "programs of the policy's episodes into the store before it" if run["aggregated"] else "")
                     + ".")
    lines += ["",
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
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
