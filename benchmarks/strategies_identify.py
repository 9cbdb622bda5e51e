"""Interop with Step-TP: for every reference transition of an implemented strategy whose
`original_is_input_leir` is true, does `identify(original, transformed)` name the row's strategy?
Also checks that every such transformed program parses and lowers. Writes
benchmarks/results/strategies_identify.md.

    python benchmarks/strategies_identify.py
"""
from __future__ import annotations

import collections
import time
from pathlib import Path

from steptp_env import Program
from steptp_env.data.reference_corpus import load_programs, load_transitions
from steptp_env.lower import lower
from steptp_env.strategies import REGISTRY, identify

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    start = time.time()
    programs = load_programs()
    counts = collections.defaultdict(collections.Counter)
    misses: dict[str, list[int]] = collections.defaultdict(list)
    for row in load_transitions():
        name = row["strategy"]
        if name not in REGISTRY or not row["original_is_input_leir"]:
            continue
        sig = programs[row["program"]]["signature"]
        before, after = Program.parse(row["original_leir"], sig), Program.parse(row["transformed_leir"], sig)
        lower(after, "cuda" if "B^" in row["transformed_leir"] else "llvm")
        found = [a.strategy for a in identify(before, after)]
        counts[name]["rows"] += 1
        if name in found:
            counts[name]["identified"] += 1
        else:
            misses[name].append(row["row"])
    lines = ["# identify on the Step-TP reference transitions", "",
             f"Rows of implemented strategies with original_is_input_leir true; every transformed program parsed "
             f"and lowered. {time.time() - start:.0f} s.", "",
             "| strategy | rows | identified | rate | first missed rows |", "|---|---|---|---|---|"]
    total = hit = 0
    for name in sorted(counts):
        c = counts[name]
        total, hit = total + c["rows"], hit + c["identified"]
        lines.append(f"| {name} | {c['rows']} | {c['identified']} | {c['identified'] / c['rows']:.1%} | "
                     f"{', '.join(map(str, misses[name][:5]))} |")
    lines += ["", f"Overall: {hit}/{total} = {hit / max(1, total):.1%}."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "strategies_identify.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
