"""Interop with Step-TP: for every reference transition of an implemented strategy whose
`original_is_input_leir` is true, does `identify(original, transformed)` name the row's strategy?
Also checks that every such transformed program parses and lowers, and counts the rows whose change is
only cosmetic (operand order, number spelling: no strategy offers those). `identify` tries only the row's
strategy, which gives the same answer as the full search (strategies are tried one by one), 43 times faster.
Writes
benchmarks/results/strategies_identify.md (strategies_identify_<out>.md with `--out`).

    python benchmarks/strategies_identify.py [--strategies a,b --out name]
"""
from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from steptp_env import Program
from steptp_env.data.reference_corpus import load_programs, load_transitions
from steptp_env.ir.ast import equations
from steptp_env.lower import lower
from steptp_env.strategies import REGISTRY, identify
from steptp_env.strategies.algebraic import cosmetic_key

from results_file import write_keeping_notes

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = "## Misses by class (written by hand"


def cosmetic_only(before: Program, after: Program) -> bool:
    """The same nests and equations, each right-hand side differing at most in operand order and number
    spelling."""
    if len(before.nests) != len(after.nests):
        return False
    for one, two in zip(before.nests, after.nests):
        old, new = list(equations(one)), list(equations(two))
        if len(old) != len(new) or any(a[0] != b[0] or a[1].lhs != b[1].lhs for a, b in zip(old, new)):
            return False
        if any(cosmetic_key(a[1].rhs) != cosmetic_key(b[1].rhs) for a, b in zip(old, new)):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default="", help="comma-separated strategy names (default: all)")
    parser.add_argument("--out", default="", help="suffix of the result file: strategies_identify_<out>.md")
    args = parser.parse_args()
    wanted = {s for s in args.strategies.split(",") if s}
    start = time.time()
    programs = load_programs()
    counts = collections.defaultdict(collections.Counter)
    misses: dict[str, list[int]] = collections.defaultdict(list)
    for row in load_transitions():
        name = row["strategy"]
        if name not in REGISTRY or not row["original_is_input_leir"] or (wanted and name not in wanted):
            continue
        sig = programs[row["program"]]["signature"]
        before, after = Program.parse(row["original_leir"], sig), Program.parse(row["transformed_leir"], sig)
        lower(after, "cuda" if "B^" in row["transformed_leir"] else "llvm")
        found = [a.strategy for a in identify(before, after, strategies=[name])]  # the label, tried alone
        counts[name]["rows"] += 1
        counts[name]["cosmetic"] += cosmetic_only(before, after)
        if name in found:
            counts[name]["identified"] += 1
        else:
            misses[name].append(row["row"])
    lines = ["# identify on the Step-TP reference transitions", "",
             f"Rows of implemented strategies with original_is_input_leir true; every transformed program parsed "
             f"and lowered. {time.time() - start:.0f} s.", "",
             "| strategy | rows | identified | rate | cosmetic-only rows | rate without them | first missed rows |",
             "|---|---|---|---|---|---|---|"]
    total = hit = cosmetic = 0
    for name in sorted(counts):
        c = counts[name]
        total, hit, cosmetic = total + c["rows"], hit + c["identified"], cosmetic + c["cosmetic"]
        real = c["rows"] - c["cosmetic"]
        lines.append(f"| {name} | {c['rows']} | {c['identified']} | {c['identified'] / c['rows']:.1%} | "
                     f"{c['cosmetic']} | {_rate(c['identified'], real)} | {', '.join(map(str, misses[name][:5]))} |")
    lines += ["", f"Overall: {hit}/{total} = {hit / max(1, total):.1%}; without the {cosmetic} cosmetic-only rows "
                  f"{hit}/{total - cosmetic} = {_rate(hit, total - cosmetic)}."]
    stem = f"strategies_identify_{args.out}" if args.out else "strategies_identify"
    write_keeping_notes(RESULTS / f"{stem}.md", "\n".join(lines), NOTES)
    print("\n".join(lines))


def _rate(hit: int, total: int) -> str:
    return f"{hit / total:.1%}" if total else "-"


if __name__ == "__main__":
    main()
