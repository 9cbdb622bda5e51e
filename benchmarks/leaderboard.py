"""The leaderboard: every built-in agent under the evaluation protocol (`agents.evaluate`) at budgets 16 and 64.

    PYTHONPATH=. python benchmarks/leaderboard.py [--agents random greedy ...] [--budgets 16 64] [--seeds 3]
        [--suite eval-small-v0] [--report-only]

Each (agent, budget) is `steptp eval --agent A --suite S --budget B --seeds K` with its folder under
benchmarks/results/leaderboard/ (runs.jsonl, summary.json, report.md, report.png); a rerun resumes every
cell where it stopped. leaderboard.md is rewritten from those folders after each cell, with the command
that reproduces each row. The agents are random, greedy, beam, focus, mcts, ppo (no shipped policy: PPO
trains on each workload for the budget's steps, then plays one greedy episode) and llm (SmolLM2, the
packaged default, proposing for the greedy search). Time it on a quiet machine at one thread.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agents.evaluate import EvalConfig, evaluate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CELLS = RESULTS / "leaderboard"
AGENTS = ["random", "greedy", "beam", "focus", "mcts", "ppo", "llm"]
BUDGETS = [16, 64]


def _cell(config: EvalConfig) -> Path:
    return CELLS / f"{config.agent}-{config.suite}-b{config.budget}"


def _interval(summary: dict, figure: str) -> str:
    value, bounds = summary.get(figure), summary.get(f"{figure}_95")
    if value is None:
        return "-"
    return f"{value:.3f}" + ("" if not bounds else f" [{bounds[0]:.3f}, {bounds[1]:.3f}]")


def report() -> str:
    """leaderboard.md from the summaries in benchmarks/results/leaderboard/, best speedup first per budget."""
    summaries = [json.loads(p.read_text()) for p in sorted(CELLS.glob("*/summary.json"))]
    lines = ["# Leaderboard", "",
             "Written by `PYTHONPATH=. python benchmarks/leaderboard.py`; each row is one `steptp eval` (its "
             "command in the last column), its runs and per-workload report in "
             "benchmarks/results/leaderboard/AGENT-SUITE-bBUDGET/. Speedups are geometric means over the "
             "workloads timed in every seed, from side-by-side timings after each search (start program, "
             "best program, PyTorch eager called directly, same thread count; a run that ended at its start "
             "program timed that program twice and counts the geometric mean of both timings for both, "
             "`agents.evaluate.run_times`); the mean over seeds with its Student-t 95% interval.", "",
             "| suite | budget | agent | speedup over start | speedup over PyTorch eager | workloads | failed runs | "
             "seeds | hours | machine | max load | command |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = sorted(summaries, key=lambda s: (s["config"]["suite"], s["config"]["budget"], -(s["speedup"] or 0)))
    for s in order:
        c = s["config"]
        lines.append(f"| {c['suite']} | {c['budget']} | {c['agent']} | {_interval(s, 'speedup')} | "
                     f"{_interval(s, 'vs_eager')} | {s['timed_in_every_seed']}/{s['workloads']} | "
                     f"{len(s['failed'])} | {len(s['per_seed'])} | {s['hours']:.2f} | "
                     f"{'; '.join(s['machines'])} | {'-' if s['max_load'] is None else format(s['max_load'], '.2f')} | "
                     f"`{s['command']}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=AGENTS)
    parser.add_argument("--budgets", type=int, nargs="+", default=BUDGETS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--suite", default="eval-small-v0")
    parser.add_argument("--report-only", action="store_true", help="rewrite leaderboard.md from the cells")
    args = parser.parse_args(argv)
    if not args.report_only:
        for budget in args.budgets:
            for agent in args.agents:
                config = EvalConfig(agent, args.suite, budget, args.seeds)

                def progress(record: dict, done: int, total: int, config: EvalConfig = config) -> None:
                    figure = "failed" if "error" in record else f"x{record['start_s'] / record['best_s']:.3f}"
                    print(f"{config.agent} b{config.budget} [{done}/{total}] {record['uri']} seed {record['seed']}: "
                          f"{figure}", flush=True)

                evaluate(config, _cell(config), progress)
                (RESULTS / "leaderboard.md").write_text(report())
    (RESULTS / "leaderboard.md").write_text(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
