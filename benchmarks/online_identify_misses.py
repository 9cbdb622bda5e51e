"""`identify` on the reference rows of the online-algorithm strategies (original_is_input_leir true): a row is
reproduced when one of its strategy's candidates or inferred actions turns the original into the transformed
program up to fresh names. Misses are classified by the refusal reasons of those actions, or by what is wrong
with the reference's result; classes in UNSOUND are rows our soundness rules forbid or reference bugs, and the
table also gives the rate over the other (sound) rows. Writes benchmarks/results/strategies_identify_online.md.

    python benchmarks/online_identify_misses.py
"""
from __future__ import annotations

import collections
import re
import time
from pathlib import Path

from steptp_env import Program
from steptp_env.data.reference_corpus import load_programs, load_transitions
from steptp_env.errors import StepTPError
from steptp_env.strategies import REGISTRY
from steptp_env.strategies.identify import canonical_text

from results_file import write_keeping_notes

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = "## The misses explained (written by hand)"
STRATEGIES = ("normal_loop_max_to_prefix_max", "normal_loop_summation_on_exp_to_prefix_summation_on_exp",
              "online_softmax", "flashattention_wo_tiling", "exponential_split", "multiplicative_split",
              "additive_split", "partially_equivalent_then_correct")
OUT_OF_BOUNDS = "the reference's result writes past the end of a tensor (reference bug)"
ZERO_DIVISOR = "split value may be zero (data divisor)"
NOT_FINITE = "split value may be infinite or NaN"
UNSOUND = (OUT_OF_BOUNDS, ZERO_DIVISOR, NOT_FINITE)
"""Miss classes that are not sound transformations: the reference's bug, or a rewrite our rules forbid."""
CLASSES = (  # (class, pattern of a refusal reason), first match wins
    (ZERO_DIVISOR, r"may be [^;]*\b0\b[^;]*; multiplicative_split"),
    (NOT_FINITE, r"may be [^;]*(inf|nan)"),
    ("split value read before it is complete", r"is not complete before nest"),
    ("split value not a float read in bounds", r"is not a float read inside"),
    ("nothing to shift in the last subscript", r"no loop variable in its last subscript"),
)


def writes_past_the_end(before: Program, after: Program) -> bool:
    """True when `after` writes outside a tensor of `before` (an intermediate's inferred shape grows)."""
    return any(name in before.tensors and after.tensors[name].shape != before.tensors[name].shape
               for name in after.tensors)


def classify(before: Program, after: Program, reasons: list[str], produced: int) -> str:
    if writes_past_the_end(before, after):
        return OUT_OF_BOUNDS
    for name, pattern in CLASSES:
        if any(re.search(pattern, r) for r in reasons):
            return name
    if produced:
        return "site recognized; our (equivalent) result differs in layout"
    return "site not recognized"


def main() -> None:
    start = time.time()
    programs = load_programs()
    rows = collections.Counter()
    misses: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for row in load_transitions():
        name = row["strategy"]
        if name not in STRATEGIES or not row["original_is_input_leir"]:
            continue
        signature = programs[row["program"]]["signature"]
        before = Program.parse(row["original_leir"], signature)
        after = Program.parse(row["transformed_leir"], signature)
        strategy, target = REGISTRY[name], canonical_text(after)
        rows[name] += 1
        reasons, produced, hit = [], 0, False
        for action in dict.fromkeys(strategy.candidates(before, "cuda") + strategy.infer(before, after)):
            try:
                hit = canonical_text(strategy.apply(before, action)) == target
            except StepTPError as exc:
                reasons.append(str(exc))
                continue
            produced += 1
            if hit:
                break
        if not hit:
            misses[(name, classify(before, after, reasons, produced))].append(row["row"])
    lines = ["# identify on the reference rows of the online-algorithm strategies", "",
             "Rows with original_is_input_leir true; a miss is a row that no candidate or inferred action of the "
             "row's own strategy turns into its transformed program (up to fresh names). Sound rows exclude the "
             f"classes {', '.join(UNSOUND)}. {time.time() - start:.0f} s.", "",
             "| strategy | rows | reproduced | sound rows | rate over sound rows |", "|---|---|---|---|---|"]
    unsound = {name: sum(len(v) for k, v in misses.items() if k[0] == name and k[1] in UNSOUND)
               for name in STRATEGIES}
    for name in STRATEGIES + ("all",):
        total = sum(rows.values()) if name == "all" else rows[name]
        bad = sum(unsound.values()) if name == "all" else unsound[name]
        hit = total - sum(len(v) for k, v in misses.items() if name in ("all", k[0]))
        lines.append(f"| {name} | {total} | {hit} ({hit / max(1, total):.1%}) | {total - bad} | "
                     f"{hit / max(1, total - bad):.1%} |")
    lines += ["", "## Misses by class", "", "| strategy | class | misses | rows |", "|---|---|---|---|"]
    for (name, kind), found in sorted(misses.items(), key=lambda kv: (STRATEGIES.index(kv[0][0]), kv[0][1])):
        lines.append(f"| {name} | {kind} | {len(found)} | {', '.join(map(str, found[:6]))} |")
    write_keeping_notes(RESULTS / "strategies_identify_online.md", "\n".join(lines), NOTES)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
