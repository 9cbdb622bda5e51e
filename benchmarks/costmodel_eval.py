"""Cost-model quality on held-out workloads.

Measures `--per-workload` programs of every suite workload at `small` (the start program and programs
reached by seeded random action sequences) into a result store, trains on 80% of the workloads and
evaluates on the other 20%: a-peak@32, p-rmse, pairwise accuracy (also over pairs more than 5% apart,
since closer pairs are within measurement noise) and Kendall tau, written to
benchmarks/results/costmodel_eval.md (a hand-written "## Notes" section already in that file is kept).
With --save DIR the model trained on all workloads is saved there (how the packaged default model is
made).

    python benchmarks/costmodel_eval.py [--per-workload 10] [--store PATH] [--save DIR] [--no-collect]
"""
from __future__ import annotations

import argparse
import collections
import itertools
import os
import time
from pathlib import Path

import numpy as np

from steptp_env import __version__
from steptp_env.costmodel import a_peak_at_k, report
from steptp_env.costmodel.dataset import collect, load_dataset, split_workloads, train
from steptp_env.measure import Protocol, ResultStore
from steptp_env.workloads import list_workloads

from results_file import write_keeping_notes

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = "## Notes"


def near_ties(runtimes: np.ndarray, groups: list[str], tie: float) -> tuple[int, int]:
    """(pairs inside a workload at most `tie` apart, all pairs inside a workload)."""
    by_workload = collections.defaultdict(list)
    for runtime, group in zip(runtimes, groups):
        by_workload[group].append(runtime)
    close = total = 0
    for values in by_workload.values():
        for a, b in itertools.combinations(values, 2):
            total += 1
            close += abs(a - b) <= tie * min(a, b)
    return close, total


def repeat_spread(store: ResultStore, uris: list[str]) -> tuple[float, float, float]:
    """Median over records of (interquartile range / median) of their repeated timings, and the range of
    1-minute load averages they were taken at: how noisy the labels themselves are."""
    spreads, loads = [], []
    for uri in uris:
        for record in store.records(uri, ok_only=True):
            q1, median, q3 = np.percentile(record["measurement"]["timings"], [25, 50, 75])
            spreads.append((q3 - q1) / median)
            loads.append(record["measurement"]["load_average"][0])
    return float(np.median(spreads)), min(loads), max(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-workload", type=int, default=10)
    parser.add_argument("--store", type=Path, default=RESULTS / "costmodel_store.sqlite")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--no-collect", action="store_true", help="evaluate on the store as it is")
    args = parser.parse_args()
    start = time.time()
    uris = list_workloads()
    protocol = Protocol(threads=args.threads)
    with ResultStore(args.store) as store:
        new = 0 if args.no_collect else collect(
            store, uris, args.per_workload, protocol=protocol,
            progress=lambda uri, n: print(f"\r{n} measured ({uri})", end="", flush=True))
        print()
        train_uris, test_uris = split_workloads(uris, 0.2, seed=0)
        model = train(store, train_uris)
        X, y, groups = load_dataset(store, test_uris)
        predicted, _ = model.predict(X)
        metrics = report(predicted, y, groups, k=32)
        extra = {k: a_peak_at_k(predicted, y, groups, k) for k in (1, 5)}
        sizes = collections.Counter(groups)
        close, pairs = near_ties(y, groups, 0.05)
        spread, load_low, load_high = repeat_spread(store, test_uris)
        total = len(load_dataset(store)[1])
        if args.save:
            packaged = train(store)
            packaged.meta.update(version=__version__, protocol=protocol.key, preset="small",
                                 trained_on=f"{total} measured programs of the suite ({len(uris)} workloads)")
            packaged.save(args.save)
    lines = ["# Cost model on held-out workloads", "",
             f"{total} measured programs over {len(uris)} workloads at `small` ({new} new this run; protocol "
             f"{protocol.key}; load average {os.getloadavg()[0]:.2f}); trained on {len(train_uris)} workloads, "
             f"evaluated on {len(test_uris)} held-out workloads ({len(y)} programs). {time.time() - start:.0f} s.",
             "", "| metric | value | target |", "|---|---|---|",
             f"| a-peak@32 | {metrics['a-peak@32']:.3f} | >= 0.85 |",
             f"| a-peak@5 | {extra[5]:.3f} | |", f"| a-peak@1 | {extra[1]:.3f} | |",
             f"| p-rmse | {metrics['p-rmse']:.3f} | |",
             f"| pairwise accuracy | {metrics['pairwise_accuracy']:.3f} | >= 0.80 |",
             f"| pairwise accuracy, pairs more than 5% apart | {metrics['pairwise_accuracy_5pct']:.3f} | |",
             f"| Kendall tau | {metrics['kendall_tau']:.3f} | |", "",
             f"Held-out workloads have {min(sizes.values())} to {max(sizes.values())} measured programs each, so "
             "a-peak@32 covers every program of a workload and is 1 by construction here; a-peak@1 and @5 are "
             "the informative figures. Pairwise accuracy skips pairs within 1% of each other.", "",
             f"Label noise: {close} of the {pairs} held-out pairs ({close / pairs:.0%}) are within 5% of each "
             "other. "
             f"The held-out programs were timed at load averages {load_low:.1f} to {load_high:.1f} on this "
             f"machine; the median interquartile range of their repeated timings is {spread:.1%} of the median."]
    write_keeping_notes(RESULTS / "costmodel_eval.md", "\n".join(lines), NOTES)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
