"""Where online_softmax and flashattention_wo_tiling fire on the suite, and what they buy: every candidate
(the reference's per-step scans and the in-place running state) applied to softmax, log-softmax, log-sum-exp
and attention workloads at preset `small`, measured single-threaded against the starting program (median of 5
timings, verified first, repeated over interleaved rounds; load average recorded). Writes
benchmarks/results/online_speedup.md.

    python benchmarks/online_speedup.py [--quick] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from steptp_env.measure import measure
from steptp_env.measure.runner import Protocol
from steptp_env.strategies import REGISTRY, apply_action
from steptp_env.workloads import get_workload, list_workloads

RESULTS = Path(__file__).resolve().parent / "results"
STRATEGIES = ("online_softmax", "flashattention_wo_tiling")
PATTERNS = ("*softmax*", "*attention*", "level2/mha*", "level2/mqa*", "level2/gqa*", "*logsumexp*")
MEASURED = ("level1/softmax", "level1/log_softmax", "level1/softmax_dim1_3d", "level2/matmul_softmax",
            "level2/gemm_sigmoid_sum_logsumexp", "level2/mha", "level2/mqa", "level2/gqa",
            "level2/mingpt_causal_attention")
QUICK = ("level1/softmax", "level2/mha")


def suite() -> list[str]:
    uris: list[str] = []
    for pattern in PATTERNS:
        uris += [u for u in list_workloads(pattern) if u not in uris]
    return uris


def firing_table() -> list[str]:
    """Candidates of both strategies on every softmax / attention / log-sum-exp workload at `tiny`."""
    lines = ["| workload | online_softmax | flashattention_wo_tiling |", "|---|---|---|"]
    totals = [0, 0]
    uris = suite()
    for uri in uris:
        program = get_workload(uri, preset="tiny").program
        counts = [len(REGISTRY[name].candidates(program)) for name in STRATEGIES]
        totals = [t + (c > 0) for t, c in zip(totals, counts)]
        lines.append(f"| {uri} | {counts[0]} | {counts[1]} |")
    lines.append(f"| **fires on** | {totals[0]}/{len(uris)} | {totals[1]}/{len(uris)} |")
    return lines


def speedup_rows(uris: tuple[str, ...], rounds: int) -> list[str]:
    """Each program measured `rounds` times, interleaved with its start program, so that load bursts on the
    shared machine hit both sides; the row reports the median over rounds and the range of the speedups."""
    protocol = Protocol(threads=1)
    lines = ["| workload | program | median ms | speedup (median, range) | verified | load average (1 min) |",
             "|---|---|---|---|---|---|"]
    for uri in uris:
        wl = get_workload(uri, preset="small")
        variants = [("start", wl.program)] + [(a.text, apply_action(wl.program, a))
                                              for name in STRATEGIES for a in REGISTRY[name].candidates(wl.program)]
        runs = [[measure(program, wl, "llvm", protocol) for _, program in variants] for _ in range(rounds)]
        for k, (label, _) in enumerate(variants):
            lines.append(_row(uri, label, [run[k] for run in runs], [run[0] for run in runs]))
            print(lines[-1], flush=True)
    return lines


def _row(uri: str, label: str, ms: list, bases: list) -> str:
    if any(m.error or m.median_s is None for m in ms + bases):
        return f"| {uri} | {label} | - | - | {all(m.verify and m.verify.equivalent for m in ms)} | - |"
    speedups = sorted(b.median_s / m.median_s for m, b in zip(ms, bases))
    middle = statistics.median(m.median_s for m in ms)
    return (f"| {uri} | {label} | {middle * 1e3:.3f} | {statistics.median(speedups):.2f}x "
            f"({speedups[0]:.2f}-{speedups[-1]:.2f}) | {all(m.verify.equivalent for m in ms)} | "
            f"{statistics.median(m.load_average[0] for m in ms):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two workloads only")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each program (default 3)")
    args = parser.parse_args()
    start = time.time()
    fires = firing_table()
    rows = speedup_rows(QUICK if args.quick else MEASURED, args.rounds)
    lines = ["# online_softmax and flashattention_wo_tiling", "",
             "Where they fire (candidates per workload, suite at `tiny`, the workloads matching "
             f"{', '.join(PATTERNS)}):", "", *fires, "",
             "Measured at preset `small` on llvm, one thread (`Protocol(threads=1)`: median of 5 timings after a "
             "warm-up), each program verified against PyTorch first, in "
             f"{args.rounds} rounds interleaved with the start program; speedup = start median / rewritten median "
             "per round, median and range over the rounds. "
             f"Machine: {os.cpu_count()} vCPUs shared with other jobs (median load average per row). "
             f"{time.time() - start:.0f} s.", "", *rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "online_speedup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
