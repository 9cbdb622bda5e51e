"""The known-bug explanations: each one fires on its bug and on nothing else."""
from __future__ import annotations

from steptp_env import Program
from steptp_env.data.reference_corpus import drop_stale_combine_loops, explain_mismatch

SIG = [{"name": "A", "shape": [4, 6], "dtype": "float64"}, {"name": "C", "shape": [4], "dtype": "float64",
                                                              "role": "output"}]
SUM = "L^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
SPLIT = ("L^{4}_{a=0}L^{2}_{d=0}L^{3}_{c=0}[E^{f64,g}_{a}=E^{f64,g}_{a}+A^{f64,g}_{a,c};];"
         "L^{4}_{a=0}L^{2}_{d=0}L^{3}_{c=0}[F^{f64,g}_{a}=F^{f64,g}_{a}+A^{f64,g}_{a,c+3};];"
         "L^{4}_{a=0}L^{2}_{d=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+(E^{f64,g}_{a}+F^{f64,g}_{a});];")


def test_stale_combine_loop_is_found_and_repaired():
    wrong = Program.parse(SPLIT.replace("L^{2}_{d=0}L^{3}_{c=0}", "L^{3}_{c=0}"), SIG)
    repaired = drop_stale_combine_loops(wrong)
    assert repaired is not None and "L^{2}_{d=0}[" not in repaired.leir
    assert "stale reduction loop" in explain_mismatch(Program.parse(SUM, SIG), wrong)


def test_domain_explanation_needs_positive_inputs_to_fix_it():
    sig = SIG[:1] + [{"name": "C", "shape": [4, 6], "dtype": "float64", "role": "output"}]
    logs = Program.parse("L^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a,c}=log(A^{f64,g}_{a,c})+log(A^{f64,g}_{a,c});];", sig)
    merged = Program.parse("L^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a,c}=log(A^{f64,g}_{a,c}*A^{f64,g}_{a,c});];", sig)
    assert explain_mismatch(logs, merged).startswith("domain")


def test_a_plain_wrong_program_is_not_explained():
    wrong = Program.parse(SUM.replace("A^{f64,g}_{a,c}", "A^{f64,g}_{a,0}"), SIG)
    assert drop_stale_combine_loops(wrong) is None
    assert explain_mismatch(Program.parse(SUM, SIG), wrong) is None
