"""A fixed, seeded sample of 300 reference transitions: every pair verifies equivalent, or its mismatch is
explained by a known reference bug that a repair proves (benchmarks/reference_transitions.py runs all)."""
from __future__ import annotations

import random

from steptp_env import Program, verify
from steptp_env.data.reference_corpus import explain_mismatch
from steptp_env.ir.analysis import loop_iterations

SAMPLE = 300
MAX_ITERATIONS = 2e7


def test_seeded_sample_of_reference_transitions(ref_programs, ref_transitions):
    signatures = {row["id"]: row["signature"] for row in ref_programs}
    rows = list(ref_transitions)
    random.Random(2026).shuffle(rows)
    checked, unexplained, explained = 0, [], []
    for row in rows:
        if checked == SAMPLE:
            break
        sig = signatures[row["program"]]
        original = Program.parse(row["original_leir"], sig)
        transformed = Program.parse(row["transformed_leir"], sig)
        if loop_iterations(original.nests) + loop_iterations(transformed.nests) > MAX_ITERATIONS:
            continue
        checked += 1
        report = verify(transformed, original, trials=2, seed=0)
        if not report.equivalent:
            why = explain_mismatch(original, transformed)
            (explained if why else unexplained).append((row["strategy"], row["program"], why or report.reason))
    assert checked == SAMPLE
    assert not unexplained, unexplained
    assert len(explained) < SAMPLE // 20, explained
