"""Search agents at the `small` preset: speedup over the starting program and runtime against PyTorch.

    PYTHONPATH=. python benchmarks/agents_small.py [--quick] [--budget 64] [--mode hybrid]
                                                   [--workloads URI ...] [--agents NAME ...]

Every agent gets `--budget` measurements (fresh or from the store; see `agents.common`) per workload. After
each search `agents.compare.compare` times the start program, the best program and PyTorch eager side by
side (3 rounds in turn, medians). One thread everywhere, so the comparison is like with like: TVM measures
with `Protocol(threads=1)`, PyTorch's module is called directly (`module(*tensors)` under
`torch.inference_mode()`, one thread, blocks sized like the kernels' timings, no NumPy copies), and the
agents' own torch work (PPO) is pinned to one thread. Each run gets a fresh copy of the packaged cost model
and its own store, so no agent learns from another's measurements.
Writes benchmarks/results/agents_small.md (agents_small_quick.md with --quick: one workload, budget 8).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from agents import get_agent
from agents.compare import ROUNDS, compare
from steptp_env.costmodel import CostModel
from steptp_env.costmodel.default import DEFAULT_MODEL_DIR
from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol, ResultStore

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKLOADS = ["level1/matmul", "level1/conv2d", "level1/softmax", "level1/layer_norm",
             "level2/conv2d_relu_hardswish", "level2/gemm_layer_norm_gelu_scale"]
AGENT_NAMES = ["random", "greedy", "beam", "mcts"]
THREADS = 1


def run_one(uri: str, agent: str, budget: int, mode: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "store.sqlite") as store:
        model = None if mode == "measure" else CostModel.load(DEFAULT_MODEL_DIR)
        env = StepTPEnv(uri, "small", mode=mode, store=store, model=model, protocol=Protocol(threads=THREADS))
        start = time.perf_counter()
        result = get_agent(agent)(env, budget, seed)
        wall = time.perf_counter() - start
        result = compare(env, result)
    if result.best_vs_torch is None:
        raise RuntimeError(f"side-by-side timing failed: {result.compared_note}")
    return {"start_s": result.initial_runtime_s, "best_s": result.best_runtime_s, "speedup": result.speedup,
            "spent": result.spent, "measured": result.measurements, "steps": len(result.trajectory),
            "wall_s": wall, "source": result.best_source, "c_start_s": result.compared_start_s,
            "c_best_s": result.compared_best_s, "c_torch_s": result.torch_s, "c_speedup": result.compared_speedup,
            "c_vs_torch": result.best_vs_torch, "path": " → ".join(step["action"] for step in result.path())}


def _cell(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="level1/matmul only, budget 8")
    parser.add_argument("--budget", type=int, default=64, help="measurements per agent and workload")
    parser.add_argument("--mode", default="hybrid", choices=["hybrid", "measure"])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS)
    parser.add_argument("--agents", nargs="+", default=AGENT_NAMES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.workloads, args.budget = args.workloads[:1], min(args.budget, 8)
    torch.set_num_threads(THREADS)
    load_before = os.getloadavg()
    rows = []
    for uri in args.workloads:
        for agent in args.agents:
            try:
                row = run_one(uri, agent, args.budget, args.mode, args.seed)
            except Exception as exc:  # noqa: BLE001  (one failure must not stop the table)
                row = {"error": f"{type(exc).__name__}: {exc}"}
            row.update(uri=uri, agent=agent)
            rows.append(row)
            print(f"{uri} {agent}: " + (f"x{row['c_speedup']:.2f}, {row['c_best_s'] * 1e3:.3f} ms against "
                                        f"PyTorch {row['c_torch_s'] * 1e3:.3f} ms ({row['wall_s']:.0f} s)"
                                        if "error" not in row else row["error"]), flush=True)
    load_after = os.getloadavg()

    lines = [f"# Search agents at `small` ({args.mode} mode, budget {args.budget} measurements, seed {args.seed})",
             "", f"- threads: {THREADS} (TVM protocol, PyTorch eager called directly, agents); {os.cpu_count()} CPUs",
             f"- load average (1/5/15 min): {' / '.join(f'{x:.2f}' for x in load_before)} before, "
             f"{' / '.join(f'{x:.2f}' for x in load_after)} after",
             f"- {time.strftime('%Y-%m-%d %H:%M')}; after each search the start program, the best program and "
             f"PyTorch are re-measured side by side ({ROUNDS} rounds in turn, medians): speedup = start / best, "
             "vs PyTorch = best / PyTorch (below 1: faster than PyTorch); 'search saw' is start / best as "
             "measured during the search, minutes apart", "",
             "| workload | agent | start ms | best ms | speedup | PyTorch ms | vs PyTorch | search saw | budget used | "
             "fresh measurements | steps | wall s | best episode |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['uri']} | {r['agent']} | ERROR: {_cell(r['error'])} |" + " |" * 10)
            continue
        lines.append(f"| {r['uri']} | {r['agent']} | {r['c_start_s'] * 1e3:.3f} | {r['c_best_s'] * 1e3:.3f} | "
                     f"{r['c_speedup']:.2f} | {r['c_torch_s'] * 1e3:.3f} | {r['c_vs_torch']:.2f} | "
                     f"{r['speedup']:.2f} | {r['spent']} | {r['measured']} | {r['steps']} | {r['wall_s']:.0f} | "
                     f"{_cell(r['path'])} |")
    ok = [r for r in rows if "error" not in r]
    if ok:
        lines += ["", "## Geometric mean speedup per agent", "", "| agent | speedup | vs PyTorch |", "|---|---|---|"]
        for agent in args.agents:
            mine = [r for r in ok if r["agent"] == agent]
            if mine:
                lines.append(f"| {agent} | {statistics.geometric_mean(r['c_speedup'] for r in mine):.2f} | "
                             f"{statistics.geometric_mean(r['c_vs_torch'] for r in mine):.2f} |")
    out = RESULTS / ("agents_small_quick.md" if args.quick else "agents_small.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
