"""How fast does `steptp generate` produce verified rows? Runs it over the whole suite at `small` for a time
limit and reports verified rows per CPU-hour (issue 19's measure: CPU seconds of the generate process and
every worker process it starts), per wall-clock hour, and the rows per strategy.

CPU seconds: the process tree is sampled every half second (psutil; each process's last reading counts),
and the generate process's own account of itself and its reaped children (`RUSAGE_CHILDREN`) is read when
it ends; the larger of the two is reported (each misses a little: the sampling the last half second of a
process, the account the children that were never reaped).

The run goes to a fresh folder (a temporary one unless --out is given), so the rate is that of new work,
not of skipping work already done. Writes benchmarks/results/generate_rate.{md,json}.

    python benchmarks/generate_rate.py [--minutes 30] [--mode model] [--steps 1] [--workers 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_counting_cpu(command: list[str]) -> tuple[float, float, float]:
    """Run `command` (checked); (CPU seconds reported, sampled over its process tree, its reaped account)."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seen: dict[tuple[int, float], float] = {}
    top = psutil.Process(proc.pid)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    seen[p.pid, p.create_time()] = times.user + times.system
        time.sleep(0.5)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sampled = sum(seen.values())
    return max(sampled, reaped), sampled, reaped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="time limit of the generate run")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--mode", default="model")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--per-strategy", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the generated steps here (must not exist)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "generated"
        if out.exists():
            sys.exit(f"{out} exists: the rate must be measured on fresh work")
        command = [sys.executable, "-m", "steptp_env.cli", "generate", "--out", str(out), "--preset", args.preset,
                   "--mode", args.mode, "--steps", str(args.steps), "--per-strategy", str(args.per_strategy),
                   "--workers", str(args.workers), "--time-limit", str(args.minutes * 60)]
        load_before = os.getloadavg()
        start = time.monotonic()
        cpu_s, sampled_s, reaped_s = run_counting_cpu(command)
        wall = time.monotonic() - start
        stats = json.loads((out / "stats.json").read_text())
    rows = sum(stats["rows_by_strategy"].values())
    rejected = sum(stats["rejected_by_strategy"].values())
    summary = {"minutes_limit": args.minutes, "wall_s": wall, "rows": rows, "rejected": rejected,
               "rows_per_hour": rows / wall * 3600, "cpu_s": cpu_s, "cpu_s_sampled": sampled_s,
               "cpu_s_reaped": reaped_s, "rows_per_cpu_hour": rows / cpu_s * 3600,
               "workloads_finished": stats["workloads_done"],
               "workloads_with_rows": len(stats["rows_by_workload"]), "load_average_before": load_before,
               "load_average_after": os.getloadavg(), "config": {k: v for k, v in vars(args).items() if k != "out"},
               "rows_by_strategy": stats["rows_by_strategy"], "rejected_by_strategy": stats["rejected_by_strategy"]}
    results = ROOT / "benchmarks" / "results"
    (results / "generate_rate.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    names = sorted(set(stats["rows_by_strategy"]) | set(stats["rejected_by_strategy"]))
    lines = [f"# steptp generate: verified rows per hour ({args.preset}, {args.mode} mode, steps={args.steps}, "
             f"per-strategy={args.per_strategy}, {args.workers} workers)\n",
             f"**{summary['rows_per_cpu_hour']:.0f} verified rows per CPU-hour** (target >= 10,000), "
             f"{summary['rows_per_hour']:.0f} per wall-clock hour: {rows} rows ({rejected} rejected) in "
             f"{wall / 60:.1f} min of wall time (limit {args.minutes:g} min, start-up included) and {cpu_s:.0f} "
             f"CPU seconds of the generate process and its workers; "
             f"{stats['workloads_done']} workloads finished, {len(stats['rows_by_workload'])} with rows. Load "
             f"average {load_before[0]:.1f} before, {summary['load_average_after'][0]:.1f} after, "
             f"{os.cpu_count()} CPUs.\n",
             "| strategy | verified rows | rejected |", "|---|---|---|"]
    lines += [f"| {n} | {stats['rows_by_strategy'].get(n, 0)} | {stats['rejected_by_strategy'].get(n, 0)} |"
              for n in names]
    (results / "generate_rate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
