"""How far apart the side-by-side comparison puts a program and itself, and what a paired timing does instead.

The leaderboard's runs whose best program is the start program give the comparison's noise directly, since
the two timed programs are one: their start/best ratios range from 0.40 to 1.10 (benchmarks/results/
leaderboard/*/runs.jsonl, the runs with an empty path). This script times the start program of workloads of
`eval-small-v0` against itself, `--repeats` times in each of three ways, at one thread:

- `compare`: what `agents.compare.compare` does, `interleave` of the program, the program again and
  PyTorch eager, `agents.compare.ROUNDS` rounds of one `measure` each (build, verify, time), medians;
- `compare, R rounds`: the same with `--rounds` rounds;
- `paired`: `measure_pair(program, program)`, alternating timings in one worker run until the ratio's 95%
  interval is within 3% (or its round and time caps).

Per workload and way it reports the median ratio, its extremes and how many repeats fell more than 10% from
1; for the `compare` ways also the spread of PyTorch eager over the program (the leaderboard's other
figure). Run it alone on the machine. Writes benchmarks/results/compare_noise.md and .json.

    PYTHONPATH=. python benchmarks/compare_noise.py [--repeats 10] [--rounds 7] [--workloads A B ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from agents.compare import ROUNDS, interleave, kernel_seconds, torch_seconds
from steptp_env.frontend.workload import Workload
from steptp_env.measure import Protocol, measure_pair
from steptp_env.measure.context import machine_description
from steptp_env.workloads import get_workload

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("level1/matrix_scalar", "level1/softsign", "level2/exp_exp", "level1/frobenius_norm",
             "level2/conv2d_subtract_tanh_subtract_avg_pool", "level1/matmul_batched_broadcast")
"""eval-small-v0 workloads whose start program met itself at ratios below 0.9 or above 1.08 on the
leaderboard (memory-bound ones, and one batched matmul)."""
FAR = 0.10


def compared(workload: Workload, protocol: Protocol, rounds: int) -> dict[str, float]:
    """One side-by-side comparison of the start program with itself: the ratio and PyTorch over the program."""
    program = workload.program
    timers: dict[str, Callable[[], float]] = {
        "program": lambda: kernel_seconds(program, workload, "llvm", protocol),
        "program again": lambda: kernel_seconds(program, workload, "llvm", protocol),
        "PyTorch": lambda: torch_seconds(workload, protocol)}
    medians, failures = interleave(timers, rounds)
    if failures:
        raise RuntimeError("; ".join(failures))
    return {"ratio": medians["program"] / medians["program again"],
            "eager_over_program": medians["PyTorch"] / medians["program"]}


def paired(workload: Workload, protocol: Protocol) -> dict[str, float]:
    """One paired timing of the start program against itself."""
    pair = measure_pair(workload.program, workload.program, workload, "llvm", protocol)
    if pair.error is not None:
        raise RuntimeError(pair.error)
    return {"ratio": pair.ratio, "rounds": pair.rounds}


def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    ratios = [s["ratio"] for s in samples]
    found = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
             "far": sum(abs(r - 1) > FAR for r in ratios)}
    eager = [s["eager_over_program"] for s in samples if "eager_over_program" in s]
    if eager:
        mid = statistics.median(eager)
        found["eager_spread"] = (max(eager) - min(eager)) / mid
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    args = parser.parse_args()
    protocol = Protocol(threads=1)
    ways: dict[str, Callable[[Workload], dict[str, float]]] = {
        "compare": lambda w: compared(w, protocol, ROUNDS),
        f"compare, {args.rounds} rounds": lambda w: compared(w, protocol, args.rounds),
        "paired": lambda w: paired(w, protocol)}
    load_before, began = os.getloadavg()[0], time.perf_counter()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for uri in args.workloads:
        workload = get_workload(uri, "small")
        results[uri] = {way: [] for way in ways}
        for _ in range(args.repeats):  # the ways in turn, so each sees the same stretch of the machine's load
            for way, take in ways.items():
                results[uri][way].append(take(workload))
        print(uri, {way: round(summary(s)["median"], 3) for way, s in results[uri].items()}, flush=True)
    load_after = os.getloadavg()[0]
    lines = ["# The side-by-side comparison against itself", "",
             f"Written by `PYTHONPATH=. python benchmarks/compare_noise.py --repeats {args.repeats} --rounds "
             f"{args.rounds}`: the start program of each workload (`small`) timed against itself {args.repeats} "
             f"times per way, the ways in turn; protocol {protocol.key}; {machine_description()}; load average "
             f"(1 min) {load_before:.2f} before, {load_after:.2f} after; {time.perf_counter() - began:.0f} s.", "",
             "| workload | way | median ratio | min | max | repeats > 10% from 1 | PyTorch/program spread |",
             "|---|---|---|---|---|---|---|"]
    for uri, by_way in results.items():
        for way, samples in by_way.items():
            s = summary(samples)
            spread = f"{s['eager_spread'] * 100:.1f}%" if "eager_spread" in s else "-"
            lines.append(f"| {uri} | {way} | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} | "
                         f"{s['far']}/{len(samples)} | {spread} |")
    lines += ["", "PyTorch/program spread: (largest - smallest) / median of PyTorch eager over the program "
              "across the repeats of that way."]
    (RESULTS / "compare_noise.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "compare_noise.json").write_text(json.dumps(
        {"protocol": protocol.key, "load_before": load_before, "load_after": load_after, "repeats": args.repeats,
         "rounds": args.rounds, "results": results}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
