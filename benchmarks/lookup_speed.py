"""How much a cached answer costs: a result-store hit and a cost-model prediction (features included), on
programs of the suite at `small` (each workload's start program and a few seeded random successors).
Writes benchmarks/results/lookup_speed.md.

    python benchmarks/lookup_speed.py [--per-workload 3] [--filter 'level1/*']
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from steptp_env.costmodel import default_model, features
from steptp_env.costmodel.dataset import random_programs
from steptp_env.measure import Protocol, ResultStore, record_key
from steptp_env.workloads import get_workload, list_workloads

RESULTS = Path(__file__).resolve().parent / "results"


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-workload", type=int, default=3)
    parser.add_argument("--filter", default=None)
    args = parser.parse_args()
    programs = []
    for uri in list_workloads(args.filter):
        programs += [(uri, p) for p in random_programs(get_workload(uri, preset="small").program,
                                                       args.per_workload, 4, seed=0)]
    model, protocol = default_model(), Protocol(threads=1)
    keyed, hit, predicted, extracted = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "s.sqlite") as store:
        for uri, program in programs:  # a record per program, of the size real ones have (features included)
            record = {"leir": program.leir, "target": "llvm", "protocol": asdict(protocol), "median_s": 1e-3,
                      "timings": [1e-3] * protocol.repeat}
            store.put(record_key(program, "llvm", protocol.key), record, uri, features(program).to_json())
        for uri, program in programs:
            fresh = type(program)(program.nests, program.signature)  # no cached text or analysis
            start = time.process_time()
            key = record_key(fresh, "llvm", protocol.key)
            middle = time.process_time()
            assert store.get(key) is not None
            end = time.process_time()
            keyed.append(end - start)
            hit.append(end - middle)
            fresh = type(program)(program.nests, program.signature)
            start = time.process_time()
            x = features(fresh)
            middle = time.process_time()
            model.predict([x.rows])
            end = time.process_time()
            predicted.append(end - start)
            extracted.append(middle - start)
    lines = ["# Cached lookups (suite at `small`)", "",
             f"{len(programs)} programs; CPU time of this process (`time.process_time`, so other jobs on the "
             f"machine inflate it less than wall time); load average {os.getloadavg()[0]:.2f}; one thread.", "",
             "| lookup | median ms | target |", "|---|---|---|",
             f"| store hit, key known (SQLite read + JSON decode) | {median_ms(hit)} | < 2 ms |",
             f"| store hit with the key computed (lowering + structural hash + read) | {median_ms(keyed)} | |",
             f"| feature extraction (PerStoreFeature + LEIR features) | {median_ms(extracted)} | < 10 ms |",
             f"| model prediction including feature extraction | {median_ms(predicted)} | < 15 ms |"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lookup_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
