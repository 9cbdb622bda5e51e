"""Every candidate of every implemented strategy on every suite workload at `tiny`, applied, lowered,
built and verified against the workload's PyTorch reference. Per-strategy table in
benchmarks/results/strategies_verify.md (failures listed in strategies_verify.json).

    python benchmarks/strategies_verify.py [--workers 2] [--filter 'level1/*']
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import multiprocessing
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def check_workload(uri: str) -> list[dict]:
    """Worker: all candidates of one workload; one dict per candidate (never raises)."""
    from steptp_env import verify
    from steptp_env.strategies import apply_action, candidates
    from steptp_env.workloads import get_workload

    wl = get_workload(uri, preset="tiny")
    rows = []
    for action in candidates(wl.program):
        row = {"workload": uri, "strategy": action.strategy, "action": action.text}
        try:
            after = apply_action(wl.program, action)
            report = verify(after, wl, trials=2)
            row.update(ok=report.equivalent, reason=report.reason)
        except Exception as exc:  # a failure to apply or build is a failed candidate, with its message
            row.update(ok=False, reason=f"{type(exc).__name__}: {exc}"[:400])
        rows.append(row)
    return rows


def main() -> None:
    from steptp_env.workloads import list_workloads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--filter", default=None)
    args = parser.parse_args()
    start = time.time()
    uris = list_workloads(args.filter)
    rows: list[dict] = []
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for result in pool.map(check_workload, uris):
            rows.extend(result)
            for row in result:
                if not row["ok"]:
                    print(f"FAILED {row['workload']} {row['action']}: {row['reason']}", flush=True)
    table = collections.defaultdict(collections.Counter)
    for row in rows:
        table[row["strategy"]]["ok" if row["ok"] else "failed"] += 1
    lines = ["# Every candidate of every strategy, verified against PyTorch (suite at `tiny`)", "",
             f"{len(uris)} workloads, {len(rows)} candidates, {sum(r['ok'] for r in rows)} verified equivalent, "
             f"{time.time() - start:.0f} s with {args.workers} workers.", "",
             "| strategy | candidates | verified | failed | rate |", "|---|---|---|---|---|"]
    for name in sorted(table):
        c = table[name]
        total = c["ok"] + c["failed"]
        lines.append(f"| {name} | {total} | {c['ok']} | {c['failed']} | {c['ok'] / total:.1%} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "strategies_verify.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "strategies_verify.json").write_text(json.dumps([r for r in rows if not r["ok"]], indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
