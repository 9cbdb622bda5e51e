"""Every candidate of every implemented strategy on every suite workload at `tiny` (or `--preset`), applied, lowered,
built and verified against the workload's PyTorch reference. Per-strategy table in
benchmarks/results/strategies_verify.md (failures listed in strategies_verify.json); with `--strategies`,
only those strategies' candidates, written to strategies_verify_<out>.md/.json.

    python benchmarks/strategies_verify.py [--workers 2] [--filter 'level1/*'] [--strategies a,b --out name]
                                           [--after strategy] [--match text] [--preset small] [--opt-level 0]
                                           [--report]

Building dominates (LLVM takes ~90% of a candidate's 0.7 s on the attention workloads); `--opt-level 0`
builds with LLVM unoptimised, 2.5x faster. The strategies' semantics are in the lowered TIR, which is the
same at every level; the level each workload was checked at is kept in the progress file and the table.
`--match pad` keeps only the candidates whose action text contains "pad" (and, with `--after`, only such
starting actions): a menu that grew is checked on its new entries without rebuilding the old ones.
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


def check_workload(uri: str, strategies: tuple[str, ...] = (), after: str = "",
                   opt_level: int | None = None, match: str = "", preset: str = "tiny") -> list[dict]:
    """Worker: all candidates of one workload (of `strategies` only, when given; whose text contains `match`);
    one dict per candidate (never raises). With `after`, the candidates on each result of each `after`
    candidate instead (for strategies such as operator_fission that only apply to transformed programs)."""
    from steptp_env import verify
    from steptp_env.strategies import REGISTRY, apply_action, candidates
    from steptp_env.workloads import get_workload

    wl = get_workload(uri, preset=preset)
    starts = [(a.text + " ; ", apply_action(wl.program, a)) for a in REGISTRY[after].candidates(wl.program)
              if match in a.text] if after else [("", wl.program)]
    rows = []
    for prefix, program in starts:
        actions = [a for name in strategies for a in REGISTRY[name].candidates(program)] if strategies \
            else candidates(program)
        for action in [a for a in actions if match in a.text]:
            row = {"workload": uri, "strategy": action.strategy, "action": prefix + action.text}
            try:
                report = verify(apply_action(program, action), wl, trials=2, opt_level=opt_level)
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
    parser.add_argument("--strategies", default="", help="comma-separated strategy names (default: all)")
    parser.add_argument("--out", default="", help="suffix of the result files: strategies_verify_<out>.md")
    parser.add_argument("--after", default="", help="check the candidates on the results of this strategy's "
                        "candidates (e.g. operator_fission after operator_fusion)")
    parser.add_argument("--preset", default="tiny", help="workload sizes (small: for menus, such as padding, "
                        "that only appear at larger extents)")
    parser.add_argument("--match", default="", help="only candidates whose action text contains this")
    parser.add_argument("--opt-level", type=int, default=None, help="LLVM optimisation level of the builds "
                        "(default: TVM's, 3)")
    parser.add_argument("--report", action="store_true", help="only tabulate the workloads done so far")
    args = parser.parse_args()
    start = time.time()
    uris = list_workloads(args.filter)
    strategies = tuple(s for s in args.strategies.split(",") if s)
    stem = f"strategies_verify_{args.out}" if args.out else "strategies_verify"
    # one line per finished workload (counts and failures), so a long run that is stopped resumes where
    # it was; the file is small enough to commit, so a later session can finish the run
    progress = RESULTS / f"{stem}.progress.jsonl"
    RESULTS.mkdir(exist_ok=True)
    done: dict[str, dict] = {}
    if progress.exists():
        for line in progress.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                done[entry["workload"]] = entry
    if args.report:
        uris = [u for u in uris if u in done]
    todo = [u for u in uris if u not in done]
    print(f"{len(uris) - len(todo)} workloads already done, {len(todo)} to go", flush=True)
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool, \
            progress.open("a") as log:
        n = len(todo)
        for uri, result in zip(todo, pool.map(check_workload, todo, [strategies] * n, [args.after] * n,
                                              [args.opt_level] * n, [args.match] * n, [args.preset] * n)):
            counts = collections.defaultdict(collections.Counter)
            for row in result:
                counts[row["strategy"]]["ok" if row["ok"] else "failed"] += 1
                if not row["ok"]:
                    print(f"FAILED {row['workload']} {row['action']}: {row['reason']}", flush=True)
            done[uri] = {"workload": uri, "counts": {k: dict(v) for k, v in sorted(counts.items())},
                         "failures": [row for row in result if not row["ok"]]}
            if args.opt_level is not None:
                done[uri]["opt_level"] = args.opt_level
            log.write(json.dumps(done[uri], sort_keys=True) + "\n")
            log.flush()
    table = collections.defaultdict(collections.Counter)
    for uri in uris:
        for name, c in done[uri]["counts"].items():
            table[name].update(c)
    failures = [row for uri in uris for row in done[uri]["failures"]]
    verified = sum(c["ok"] for c in table.values())
    total = verified + sum(c["failed"] for c in table.values())
    which = f"the strategies {', '.join(strategies)}" if strategies else "every strategy"
    which += f" whose text contains {args.match!r}" if args.match else ""
    which += f" on the results of every {args.after} candidate" + (" containing it" if args.match else "") \
        if args.after else ""
    lines = [f"# Every candidate of {which}, verified against PyTorch (suite at `{args.preset}`)", "",
             f"{len(uris)} workloads{' (done so far)' if args.report else ''}, {total} candidates, "
             f"{verified} verified equivalent, " + (
                 f"tabulated from {progress.name} (the run is not finished)." if args.report else
                 f"{time.time() - start:.0f} s with {args.workers} workers in the last run (a stopped run "
                 f"resumes from {progress.name})."), "",
             f"LLVM optimisation level of the builds, by workloads: {_levels(done, uris)}.", "",
             "| strategy | candidates | verified | failed | rate |", "|---|---|---|---|---|"]
    for name in sorted(set(table) | set(strategies)):
        c = table[name]
        total = c["ok"] + c["failed"]
        rate = f"{c['ok'] / total:.1%}" if total else "-"
        lines.append(f"| {name} | {total} | {c['ok']} | {c['failed']} | {rate} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps(failures, indent=1) + "\n")
    print("\n".join(lines))


def _levels(done: dict[str, dict], uris: list[str]) -> str:
    levels = collections.Counter(done[uri].get("opt_level", 3) for uri in uris)
    return ", ".join(f"{count} at {level}" + (" (TVM's default)" if level == 3 else "")
                     for level, count in sorted(levels.items(), reverse=True))


if __name__ == "__main__":
    main()
