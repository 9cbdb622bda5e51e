"""Speed of the action machinery on the suite at `small`: enumerating all candidates of all strategies
per program, and applying one action. Writes benchmarks/results/strategies_speed.md.

    python benchmarks/strategies_speed.py
"""
from __future__ import annotations

import collections
import os
import statistics
import time
from pathlib import Path

from steptp_env.strategies import REGISTRY, STRATEGY_NAMES, apply_action, base
from steptp_env.workloads import get_workload, list_workloads

RESULTS = Path(__file__).resolve().parent / "results"
FAMILY = STRATEGY_NAMES[:23]  # the loop, memory and graph strategies


def main() -> None:
    enumerate_s, apply_s = [], collections.defaultdict(list)
    for uri in list_workloads():
        program = get_workload(uri, preset="small").program
        program = type(program)(program.nests, program.signature)  # a fresh object: no cached analysis
        base._NEST_CANDIDATES.clear()  # nests equal to another workload's would find their candidates there
        start = time.process_time()
        actions = [a for name in FAMILY if name in REGISTRY for a in REGISTRY[name].candidates(program, "llvm")]
        enumerate_s.append(time.process_time() - start)
        for action in actions[:: max(1, len(actions) // 10)]:
            start = time.process_time()
            apply_action(program, action)
            apply_s[action.strategy].append(time.process_time() - start)
    every_apply = [t for ts in apply_s.values() for t in ts]
    lines = ["# Strategy machinery speed (suite at `small`, one thread)", "",
             f"The 23 loop, memory and graph strategies; each program is a fresh object and the per-nest "
             f"candidate cache is cleared before it, so no cached analysis or candidates carry over. Times are "
             f"CPU time of this process (`time.process_time`), "
             f"so other jobs on the machine inflate them less than wall time would. Load average {os.getloadavg()[0]:.2f} on "
             f"{os.cpu_count()} cores.", "",
             f"- candidates of all strategies per program: median {statistics.median(enumerate_s) * 1e3:.2f} ms, "
             f"p90 {sorted(enumerate_s)[int(0.9 * len(enumerate_s))] * 1e3:.2f} ms over {len(enumerate_s)} programs "
             "(target < 20 ms median)",
             f"- apply: median {statistics.median(every_apply) * 1e3:.3f} ms over {len(every_apply)} actions "
             "(target < 2 ms median)", "", "| strategy | applies | median ms |", "|---|---|---|"]
    for name in sorted(apply_s):
        lines.append(f"| {name} | {len(apply_s[name])} | {statistics.median(apply_s[name]) * 1e3:.3f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "strategies_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
