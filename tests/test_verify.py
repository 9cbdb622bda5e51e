"""verify: equivalent programs pass, wrong ones are results with a reason (never exceptions)."""
from __future__ import annotations

import numpy as np
import pytest

from steptp_env import Program, verify
from steptp_env.measure import compare, random_inputs
from steptp_env.measure.inputs import index_bounds
from steptp_env.measure.tolerance import relative_tolerance


def sig(*specs):
    return [{"name": n, "shape": list(s), "dtype": d, "role": r} for n, s, d, r in specs]


MATMUL_SIG = sig(("A", (8, 16), "float32", "input"), ("B", (16, 4), "float32", "input"),
                 ("C", (8, 4), "float32", "output"))
MATMUL = "L^{8}_{a=0}L^{4}_{c=0}L^{16}_{d=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];"


def matmul_reference(inputs):
    return inputs["A"].astype(np.float64) @ inputs["B"]


def test_equivalent_program_passes_against_a_callable():
    report = verify(Program.parse(MATMUL, MATMUL_SIG), matmul_reference, trials=3, seed=0)
    assert report.equivalent, report.reason
    assert report.trials == 3 and 0 < report.max_abs_err < 1e-4


def test_split_reduction_is_equivalent_to_the_original_program():
    split = ("L^{8}_{a=0}L^{4}_{c=0}L^{8}_{d=0}[E^{f32,g}_{a,c}=E^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];"
             "L^{8}_{a=0}L^{4}_{c=0}L^{8}_{d=0}[F^{f32,g}_{a,c}=F^{f32,g}_{a,c}+A^{f32,g}_{a,d+8}*B^{f32,g}_{d+8,c};];"
             "L^{8}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+(E^{f32,g}_{a,c}+F^{f32,g}_{a,c});];")
    report = verify(Program.parse(split, MATMUL_SIG), Program.parse(MATMUL, MATMUL_SIG))
    assert report.equivalent, report.reason


STRIDED_SIG = sig(("A", (24,), "float32", "input"), ("D", (1,), "float32", "output"))
STRIDED = "L^{8}_{c=0}[E^{f32,g}_{c*3}=A^{f32,g}_{c*3};];"
"""E holds every third element of A; the elements between are memory no nest writes."""


def test_a_program_that_reads_elements_no_nest_wrote_fails_before_it_runs():
    total = Program.parse(STRIDED + "L^{8}_{c=0}[D^{f32,g}_{0}=D^{f32,g}_{0}+E^{f32,g}_{c*3};];", STRIDED_SIG)
    # x + E[c*3-1] - E[c*3-1]: exact in arithmetic, but E[c*3-1] was never written (garbage - garbage is
    # 0 for most bit patterns, NaN for inf and NaN ones)
    lucky = Program.parse(STRIDED + "L^{8}_{c=0}[D^{f32,g}_{0}=D^{f32,g}_{0}+E^{f32,g}_{c*3}"
                          "+if_then_else(c<1,0,E^{f32,g}_{c*3-1})-if_then_else(c<1,0,E^{f32,g}_{c*3-1});];",
                          STRIDED_SIG)
    report = verify(lucky, total, trials=2)
    assert not report.equivalent and report.trials == 0
    assert "E^{f32,g}_{c*3-1}" in report.reason and "no earlier nest wrote" in report.reason
    # the same reads behind a condition on loop variables that excludes them are fine
    guarded = Program.parse(STRIDED + "L^{8}_{c=0}[D^{f32,g}_{0}=D^{f32,g}_{0}+E^{f32,g}_{c*3}"
                            "+if_then_else(c<9,0,E^{f32,g}_{c*3-1});];", STRIDED_SIG)
    assert verify(guarded, total, trials=2).equivalent


@pytest.mark.parametrize("wrong, why", [
    (MATMUL.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{d,0}"), "element"),  # a misplaced index
    (MATMUL.replace("L^{16}_{d=0}", "L^{15}_{d=0}"), "element"),  # one term short
    ("L^{8}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=0.0*A^{f32,g}_{a,0};];", "element"),
])
def test_wrong_programs_are_reported_with_a_position(wrong, why):
    report = verify(Program.parse(wrong, MATMUL_SIG), matmul_reference)
    assert not report.equivalent and why in report.reason
    assert report.first_mismatch is not None and report.first_mismatch[0] == "C"


def test_nan_positions_must_match():
    s = sig(("A", (6,), "float64", "input"), ("C", (6,), "float64", "output"))
    log = Program.parse("L^{6}_{a=0}[C^{f64,g}_{a}=log(A^{f64,g}_{a});];", s)
    with np.errstate(invalid="ignore"):
        assert verify(log, lambda t: np.log(t["A"])).equivalent
        report = verify(log, lambda t: np.log(np.abs(t["A"])))
    assert not report.equivalent and "NaN" in report.reason


def test_integer_outputs_must_be_equal():
    s = sig(("A", (4, 5), "float64", "input"), ("C", (4,), "int64", "output"))
    argmax = Program.parse("L^{4}_{a=0}L^{5}_{c=0}[D^{f64,g}_{a}=max(D^{f64,g}_{a},A^{f64,g}_{a,c});"
                           "C^{i64,g}_{a}=0;];L^{4}_{a=0}L^{5}_{c=0}[C^{i64,g}_{a}=if_then_else("
                           "A^{f64,g}_{a,c}>=D^{f64,g}_{a},c,C^{i64,g}_{a});];", s)
    assert verify(argmax, lambda t: t["A"].argmax(1)).equivalent
    assert not verify(argmax, lambda t: t["A"].argmin(1)).equivalent


def test_tolerance_grows_with_dtype_and_reduction_length():
    assert relative_tolerance("float64", 1) < relative_tolerance("float32", 1) < relative_tolerance("float16", 1)
    assert relative_tolerance("float32", 4096) > relative_tolerance("float32", 16)
    assert relative_tolerance("int64", 100) == 0.0
    ok = compare(np.array([1.0, 2.0 + 1e-7]), np.array([1.0, 2.0]), relative_tolerance("float32", 1))
    bad = compare(np.array([1.0, 2.01]), np.array([1.0, 2.0]), relative_tolerance("float32", 1))
    assert ok.equivalent and not bad.equivalent and bad.first_mismatch[1] == (1,)


def test_index_inputs_stay_inside_the_dimension_they_index():
    s = sig(("A", (7, 5), "float64", "input"), ("T", (100,), "int64", "input"),
            ("C", (100,), "float64", "output"))
    gather = Program.parse("L^{100}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{T^{i64,g}_{a},4-T^{i64,g}_{a}+2};];", s)
    assert index_bounds(gather)["T"] == (2, 6)
    t = random_inputs(gather, 3)["T"]
    assert t.min() >= 2 and t.max() <= 6
    assert verify(gather, lambda x: x["A"][x["T"], 6 - x["T"]]).equivalent


def test_random_inputs_are_seeded():
    program = Program.parse(MATMUL, MATMUL_SIG)
    a, b, c = random_inputs(program, 1), random_inputs(program, 1), random_inputs(program, 2)
    assert np.array_equal(a["A"], b["A"]) and not np.array_equal(a["A"], c["A"])


def test_large_workload_cases_are_not_remembered(monkeypatch):
    """The seeded draws and reference outputs of a workload are remembered for the next verification, but
    not when they exceed CASE_BYTES_KEPT (imported programs reach gigabytes)."""
    import importlib

    from steptp_env.workloads import get_workload

    verify_module = importlib.import_module("steptp_env.measure.verify")  # the package attribute is the function

    wl = get_workload("level1/relu", preset="tiny")
    verify_module._CASES.clear()
    assert verify(wl.program, wl, trials=1).equivalent and len(verify_module._CASES) == 1
    verify_module._CASES.clear()
    monkeypatch.setattr(verify_module, "CASE_BYTES_KEPT", 0)
    assert verify(wl.program, wl, trials=1).equivalent and len(verify_module._CASES) == 0


def test_unoptimised_builds_verify_the_same_programs():
    """`opt_level=0` (bulk checks) builds with LLVM unoptimised and reaches the same verdicts."""
    from steptp_env.measure.build import resolve_target

    assert int(resolve_target("llvm", 0).attrs["opt-level"]) == 0
    assert "opt-level" not in resolve_target("llvm").attrs
    program = Program.parse(MATMUL, MATMUL_SIG)
    assert verify(program, matmul_reference, opt_level=0).equivalent
    wrong = Program.parse(MATMUL.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{d,0}"), MATMUL_SIG)
    assert not verify(wrong, matmul_reference, opt_level=0).equivalent


def test_chunked_comparison_finds_the_first_bad_element_anywhere(monkeypatch):
    """The comparison runs a few elements at a time; counts, the first bad position and the figures are
    those of the whole array."""
    import importlib

    monkeypatch.setattr(importlib.import_module("steptp_env.measure.verify"), "CHUNK", 7)
    expected = np.linspace(1.0, 2.0, 60, dtype=np.float32).reshape(3, 4, 5)
    actual = expected.copy()
    actual[2, 1, 3] *= 1.01
    actual[2, 3, 0] *= 1.02
    report = compare(actual, expected, 1e-4)
    assert not report.equivalent and report.first_mismatch[1] == (2, 1, 3)
    assert report.reason.startswith("2 element(s) off") and report.max_rel_err == pytest.approx(0.02, rel=1e-3)
    actual = expected.copy()
    actual[1, 2, 2] = np.nan
    report = compare(actual, expected, 1e-4)
    assert not report.equivalent and report.first_mismatch[1] == (1, 2, 2) and "1 NaN/inf" in report.reason
    assert compare(expected.copy(), expected, 1e-6).equivalent
    ints = np.arange(20, dtype=np.int32)
    wrong = ints.copy()
    wrong[15] = -1
    report = compare(wrong, ints, 0.0)
    assert not report.equivalent and report.first_mismatch[1] == (15,) and report.reason.startswith("1 integer")


@pytest.mark.parametrize("chunk", [1 << 22, 3])
def test_infinities_must_match_in_sign_and_position(monkeypatch, chunk):
    """NaN and inf positions agree, in one chunk or several: an inf equal on both sides passes (and is left
    out of the tolerance's mean magnitude), one of the other sign, a finite value or a NaN against it
    fails at its position."""
    import importlib

    monkeypatch.setattr(importlib.import_module("steptp_env.measure.verify"), "CHUNK", chunk)
    expected = np.array([1.0, np.inf, 2.0, -np.inf, np.nan, 3.0, 4.0], dtype=np.float32)
    assert compare(expected.copy(), expected, 1e-6).equivalent
    for position, value in ((1, -np.inf), (3, 5.0), (1, np.nan), (5, np.inf)):
        actual = expected.copy()
        actual[position] = value
        report = compare(actual, expected, 1e-6)
        assert not report.equivalent and report.first_mismatch[1] == (position,) and "1 NaN/inf" in report.reason
    actual = expected.copy()
    actual[6] *= 1.01
    report = compare(actual, expected, 1e-4)
    assert not report.equivalent and report.first_mismatch[1] == (6,)
    assert report.max_rel_err == pytest.approx(0.01, rel=1e-3)


def test_finite_float64_values_whose_sum_overflows_compare_as_finite():
    """An all-finite chunk is told by its finite sums; float64 values near the largest float overflow a sum,
    and take the exact path with the same verdicts."""
    big = np.full(8, 1e308)
    assert compare(big.copy(), big, 1e-6).equivalent
    off = big.copy()
    off[5] = 0.9e308
    report = compare(off, big, 1e-6)
    assert not report.equivalent and report.first_mismatch[1] == (5,)
    off[5] = np.inf
    assert "1 NaN/inf" in compare(off, big, 1e-6).reason


def test_small_draws_run_in_one_runner_call_and_large_ones_one_at_a_time(monkeypatch):
    """A worker's round trip is paid once for draws that together fit `BATCH_BYTES`; above it each draw
    is taken and run alone. Both give the same verdict."""
    import importlib

    module = importlib.import_module("steptp_env.measure.verify")
    program = Program.parse(MATMUL, MATMUL_SIG)
    kernel = module.build(program)
    calls = []

    def runner(sets):
        calls.append(len(sets))
        return [kernel.run_checked(s) for s in sets]

    assert verify(program, matmul_reference, trials=3, runner=runner).equivalent and calls == [3]
    calls.clear()
    monkeypatch.setattr(module, "BATCH_BYTES", 0)
    assert verify(program, matmul_reference, trials=3, runner=runner).equivalent and calls == [1, 1, 1]
    wrong = Program.parse(MATMUL.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{d,0}"), MATMUL_SIG)
    bad = module.build(wrong)
    assert not verify(wrong, matmul_reference, runner=lambda sets: [bad.run_checked(s) for s in sets]).equivalent
