"""LLVM's optimisation level: what O2 (or O1) saves in compile and JIT time and what it costs in kernel speed,
against TVM's default O3, on the programs a measured step meets (issue 19: a measured step's overhead is
mostly LLVM's time on the new module).

    TVM_NUM_THREADS=1 PYTHONPATH=. python benchmarks/opt_level.py [--levels 2 1] [--walks 4]
        [--workloads level1/matmul,...] [--preset small]

For each workload: its start program and --walks seeded random chains of 1-5 candidate actions from it
(`strategies.random_chain`). Each program is built in this process at O3 and at each of --levels: lowering
and `tvm.compile` (the build), then the entry function's first lookup (the JIT link), each timed. The
lower level's kernel is checked against PyTorch (one seeded draw, `verify`), then both kernels are timed
paired (`measure.paired.interleave`: rounds alternating their order, the median of the rounds' log ratios
with its 95% interval), pinned to one core at one thread, each timing scaled by the process's share of its
wall time as the environment's paired rewards are. Writes benchmarks/results/opt_level.md and .json.
Time it on a quiet machine: nothing else running; the load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # TVM reads it at import; the protocol is one thread

from steptp_env.measure.build import build  # noqa: E402
from steptp_env.measure.paired import median_interval, log_ratios  # noqa: E402
from steptp_env.measure.verify import verify  # noqa: E402
from steptp_env.measure.worker import paired_timings  # noqa: E402
from steptp_env.strategies import random_chain  # noqa: E402
from steptp_env.workloads import get_workload  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = "level1/matmul,level1/softmax,level1/conv2d,level1/layer_norm,level2/gemm_relu_divide"
MIN_SECONDS = 1e-4  # one timing lasts at least this long (Protocol's default)
SLOWER = 1.05  # a program counts as slower at a level when O3 is more than this much faster


def programs_of(uri: str, preset: str, walks: int, seed: int) -> list:
    """The workload's start program and `walks` seeded random chains of 1-5 actions from it."""
    start = get_workload(uri, preset).program
    rng = random.Random(f"{uri}/{seed}")
    found = [start]
    for _ in range(walks):
        try:
            found.append(random_chain(start, rng, rng.randint(1, 5), []))
        except Exception:  # noqa: BLE001  (a chain whose action fails is skipped; the draw order stays seeded)
            continue
    return found


def compiled(program, level: int | None) -> tuple:
    """(kernel, build seconds, JIT-link seconds) at LLVM level `level` (None: TVM's default, O3)."""
    start = time.perf_counter()
    kernel = build(program, "llvm", level)
    built = time.perf_counter()
    kernel.link()
    return kernel, built - start, time.perf_counter() - built


def paired_ratio(o3, other, inputs) -> tuple[float, float, float, int]:
    """(O3's time / the other's, low, high, rounds): above 1 where the other level's kernel is faster."""
    before, after = paired_timings((o3, other), inputs, MIN_SECONDS, threads=1)
    low, mid, high = median_interval(log_ratios(before, after))
    return math.exp(mid), math.exp(low), math.exp(high), len(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=WORKLOADS)
    parser.add_argument("--levels", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--walks", type=int, default=4)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for uri in args.workloads.split(","):
        workload = get_workload(uri, args.preset)
        inputs = workload.make_inputs(0)
        for number, program in enumerate(programs_of(uri, args.preset, args.walks, args.seed)):
            o3, build_s, jit_s = compiled(program, None)
            row = {"workload": uri, "program": number, "leir": program.leir,
                   "levels": {"3": {"build_ms": build_s * 1e3, "jit_ms": jit_s * 1e3}}}
            for level in args.levels:
                kernel, build_s, jit_s = compiled(program, level)
                report = verify(program, workload, trials=1, kernel=kernel)
                ratio, low, high, rounds = paired_ratio(o3, kernel, inputs) if report.equivalent else (None,) * 4
                row["levels"][str(level)] = {"build_ms": build_s * 1e3, "jit_ms": jit_s * 1e3,
                                             "equivalent": report.equivalent, "o3_over_level": ratio,
                                             "low": low, "high": high, "rounds": rounds}
            rows.append(row)
            print(uri, number, {k: {kk: round(vv, 3) if isinstance(vv, float) else vv for kk, vv in v.items()}
                                for k, v in row["levels"].items()}, flush=True)
    load_after = os.getloadavg()
    write(rows, args, load_before, load_after)


def write(rows: list[dict], args: argparse.Namespace, load_before, load_after) -> None:
    levels = ["3", *map(str, args.levels)]
    lines = ["# LLVM optimisation level: compile time against kernel speed", "",
             f"Written by `benchmarks/opt_level.py` ({len(rows)} programs: the start programs of "
             f"{args.workloads.replace(',', ', ')} at `{args.preset}` and {args.walks} seeded random chains of "
             f"1-5 actions from each); TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}, paired timings pinned to "
             f"one core; load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
             f"{os.cpu_count()} CPUs.", "",
             "| LLVM level | median build ms | median JIT-link ms | median build + JIT ms | kernel speed vs O3 "
             "(geomean of O3 time / this level's) | programs slower than O3 by > 5% | not equivalent |",
             "|---|---|---|---|---|---|---|"]
    for level in levels:
        found = [r["levels"][level] for r in rows]
        total = statistics.median(f["build_ms"] + f["jit_ms"] for f in found)
        if level == "3":
            speed, slower, wrong = "1 (reference)", "-", "-"
        else:
            ratios = [f["o3_over_level"] for f in found if f["o3_over_level"]]
            speed = f"{math.exp(statistics.mean(math.log(r) for r in ratios)):.3f} (min {min(ratios):.3f})"
            slower = f"{sum(r < 1 / SLOWER for r in ratios)} of {len(ratios)}"
            wrong = str(sum(not f["equivalent"] for f in found))
        lines.append(f"| O{level} | {statistics.median(f['build_ms'] for f in found):.0f} | "
                     f"{statistics.median(f['jit_ms'] for f in found):.0f} | {total:.0f} | {speed} | {slower} | "
                     f"{wrong} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "opt_level.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "opt_level.json").write_text(json.dumps({"rows": rows, "load_before": load_before,
                                                        "load_after": load_after}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
