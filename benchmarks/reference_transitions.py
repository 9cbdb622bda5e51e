"""Verify the Step-TP reference transitions with our lowering: is each transformed program equivalent to
its original?

For every transition of ../shared/steptp-ref/transitions.jsonl.gz whose two programs have at most
2e7 loop iterations together, both programs are lowered, built and run on the same seeded random inputs
(`verify(transformed, original)`). Each pair runs in a worker process, so a transformed program that
crashes natively is recorded instead of ending the run. Writes a per-strategy table and the list of
non-equivalent pairs to benchmarks/results/reference_transitions.{md,json}.

    python benchmarks/reference_transitions.py [--limit N] [--workers 2]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import multiprocessing
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_ITERATIONS = 2e7


def load_pairs(limit_iterations: float = MAX_ITERATIONS) -> list[dict]:
    """Reference transitions small enough to run, each with its signature, in file order."""
    from steptp_env import Program
    from steptp_env.data.reference_corpus import load_programs, load_transitions
    from steptp_env.ir.analysis import loop_iterations

    programs = load_programs()
    pairs = []
    for row in load_transitions():
        sig = programs[row["program"]]["signature"]
        a = Program.parse(row["original_leir"], sig)
        b = Program.parse(row["transformed_leir"], sig)
        if loop_iterations(a.nests) + loop_iterations(b.nests) <= limit_iterations:
            pairs.append({"row": row["row"], "program": row["program"], "strategy": row["strategy"],
                          "original": row["original_leir"], "transformed": row["transformed_leir"],
                          "signature": sig})
    return pairs


def check_pair(pair: dict) -> dict:
    """Worker: verify one transition and explain a mismatch; returns a plain dict (never raises)."""
    from steptp_env import Program, verify
    from steptp_env.data.reference_corpus import explain_mismatch

    try:
        a = Program.parse(pair["original"], pair["signature"])
        b = Program.parse(pair["transformed"], pair["signature"])
        report = verify(b, a, trials=3, seed=0)
        explanation = None if report.equivalent else explain_mismatch(a, b)
        return {"equivalent": report.equivalent, "reason": report.reason, "explanation": explanation}
    except Exception as exc:  # a build failure is a result here, with its message
        return {"equivalent": False, "reason": f"{type(exc).__name__}: {exc}"[:500], "explanation": None}


def run(pairs: list[dict], workers: int) -> list[dict]:
    results: dict[int, dict] = {}
    todo = list(range(len(pairs)))
    ctx = multiprocessing.get_context("spawn")
    while todo:
        with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = {pool.submit(check_pair, pairs[i]): i for i in todo}
            try:
                for fut in cf.as_completed(futures):
                    results[futures[fut]] = fut.result()
            except cf.process.BrokenProcessPool:
                pass
        crashed = [i for i in todo if i not in results]
        if crashed:  # the pool broke: rerun the unfinished ones one by one to find the crasher
            first = crashed[0]
            with cf.ProcessPoolExecutor(1, mp_context=ctx) as solo:
                try:
                    results[first] = solo.submit(check_pair, pairs[first]).result()
                except cf.process.BrokenProcessPool:
                    results[first] = {"equivalent": False, "reason": "worker process crashed", "explanation": None}
        todo = [i for i in todo if i not in results]
    return [dict(pairs[i], **results[i]) for i in range(len(pairs))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="check only the first N pairs (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    start = time.time()
    pairs = load_pairs()
    if args.limit:
        pairs = pairs[: args.limit]
    results = run(pairs, args.workers)
    by_strategy: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_strategy[r["strategy"]]["equivalent" if r["equivalent"] else "not equivalent"] += 1
    failures = [r for r in results if not r["equivalent"]]
    explained = collections.Counter(r["explanation"] or "UNEXPLAINED" for r in failures)
    lines = ["# Reference transitions verified with steptp_env's lowering", "",
             f"{len(results)} pairs with at most {MAX_ITERATIONS:.0e} loop iterations together; "
             f"{len(results) - len(failures)} equivalent, {len(failures)} not; {time.time() - start:.0f} s "
             f"with {args.workers} workers.", "",
             "| strategy | pairs | equivalent | not equivalent |", "|---|---|---|---|"]
    for name in sorted(by_strategy):
        c = by_strategy[name]
        lines.append(f"| {name} | {sum(c.values())} | {c['equivalent']} | {c['not equivalent']} |")
    lines += ["", "Why the others differ (each explanation is proven by a repair that verifies):", ""]
    for why, count in explained.most_common():
        lines.append(f"- {count} x {why}")
        lines += [f"  - row {r['row']} ({r['strategy']}, {r['program']})" for r in failures
                  if (r["explanation"] or "UNEXPLAINED") == why]
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "reference_transitions.md").write_text("\n".join(lines) + "\n")
    keep = ("row", "program", "strategy", "reason", "explanation", "original", "transformed")
    (out / "reference_transitions.json").write_text(json.dumps([{k: r[k] for k in keep} for r in failures],
                                                               indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
