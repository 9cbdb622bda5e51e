"""Seeded random chains of actions on the suite at `tiny`: each chain picks one of the current program's
candidates at random, `--length` times, and the final program is verified against the workload's PyTorch
reference in a worker process (a kernel that crashes, or corrupts memory, is a failed chain, not the end of
the run; a failing chain is replayed to name the first step whose program fails). CI runs the short
version (tests/test_strategies.py: 30 workloads, one chain of 10 each); this is the long one. Writes
benchmarks/results/strategy_chains.md and the failing chains to strategy_chains.json.

    python benchmarks/strategy_chains.py [--workers 2] [--seeds 3] [--length 10] [--filter 'level1/*']
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import multiprocessing
import os
import random
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_CHECKED: list[str] = []
"""The chains this process has checked since its verification worker last crashed: where a crash does not
reproduce on replay, an earlier program in this list corrupted the worker."""


def run_chains(uri: str, seeds: int, length: int) -> list[dict]:
    """Worker: `seeds` chains on one workload; one dict per chain (never raises)."""
    from steptp_env.strategies import random_chain
    from steptp_env.workloads import get_workload

    wl = get_workload(uri, preset="tiny")
    rows = []
    for seed in range(seeds):
        path: list[str] = []
        row = {"workload": uri, "seed": seed, "path": path}
        try:
            program = random_chain(wl.program, random.Random(f"{uri}/{seed}"), length, path)
            report = _check(program, wl)
            row.update(ok=report["equivalent"], reason=report["reason"])
            if "crashed" in (report["reason"] or ""):
                row["worker_history"] = list(_CHECKED)
                _CHECKED.clear()
            _CHECKED.append(f"{uri} seed {seed}")
            if not report["equivalent"]:
                row["first_failing_step"] = _first_failing_step(wl, path)
        except Exception as exc:  # a chain that cannot be applied or built is a failed chain, with its message
            row.update(ok=False, reason=f"{type(exc).__name__}: {exc}"[:400])
        rows.append(row)
    return rows


def _first_failing_step(wl, path: list[str]) -> int | None:
    """Index of the first action after which the program no longer verifies; None when every step verifies on
    the replay (the failure did not reproduce: a crash caused by an earlier program in the same worker)."""
    from steptp_env.strategies import apply_action

    program = wl.program
    for step, text in enumerate(path):
        program = apply_action(program, text)
        if not _check(program, wl)["equivalent"]:
            return step
    return None


def _check(program, wl) -> dict:
    """Verify report (as a dict) of `program` against the workload, built and run in a worker process."""
    from steptp_env.data.verification import check
    from steptp_env.measure import Protocol

    return check(program, wl, protocol=Protocol(threads=1, trials=2))


def _where(row: dict) -> str:
    if "first_failing_step" not in row:
        return "while applying"
    step = row["first_failing_step"]
    return "not reproduced on replay (every step verifies)" if step is None else f"step {step}"


def main() -> None:
    from steptp_env.workloads import list_workloads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3, help="chains per workload")
    parser.add_argument("--length", type=int, default=10, help="actions per chain")
    parser.add_argument("--filter", default=None)
    args = parser.parse_args()
    start, load = time.time(), os.getloadavg()[0]
    uris = list_workloads(args.filter)
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        chains = [row for rows in pool.map(run_chains, uris, [args.seeds] * len(uris), [args.length] * len(uris))
                  for row in rows]
    failures = [row for row in chains if not row["ok"]]
    steps = collections.Counter(text.split("(")[0] for row in chains for text in row["path"])
    lines = ["# Seeded random chains of actions, verified against PyTorch (suite at `tiny`)", "",
             f"{len(uris)} workloads x {args.seeds} chains of up to {args.length} actions (a chain stops early "
             f"where no action is left): **{len(chains) - len(failures)}/{len(chains)} chains verify**. "
             f"{sum(steps.values())} actions in all, drawn uniformly among every registered strategy's "
             f"candidates. {time.time() - start:.0f} s with {args.workers} workers, load average {load:.2f}.", "",
             "| strategy | actions in the chains |", "|---|---|"]
    lines += [f"| {name} | {count} |" for name, count in sorted(steps.items())]
    if failures:
        lines += ["", "## Failing chains", ""]
        lines += [f"- {row['workload']} seed {row['seed']}: {_where(row)} of {' ; '.join(row['path'])}: "
                  f"{row['reason']}" for row in failures]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "strategy_chains.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "strategy_chains.json").write_text(json.dumps(failures, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
