"""Paired timing (`measure.paired`): the median-ratio statistics and the interleaved worker run on real
kernels. No assertion is about speed: a test checks what was measured and how, not how fast it was."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from steptp_env import Program
from steptp_env.measure import PairedTiming, measure_pair
from steptp_env.measure.paired import MIN_ROUNDS, interleave, log_ratios, median_interval
from steptp_env.measure.runner import Protocol

SIG = [{"name": "A", "shape": [48, 48], "dtype": "float32"}, {"name": "B", "shape": [48, 48], "dtype": "float32"},
       {"name": "C", "shape": [48, 48], "dtype": "float32", "role": "output"}]
BODY = "[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];"
ACD = Program.parse("L^{48}_{a=0}L^{48}_{c=0}L^{48}_{d=0}" + BODY, SIG)
ADC = Program.parse("L^{48}_{a=0}L^{48}_{d=0}L^{48}_{c=0}" + BODY, SIG)
ONE = Protocol(threads=1, build_timeout=60, run_timeout=20)


def reference(t):
    return t["A"].astype(np.float64) @ t["B"]


@pytest.mark.parametrize("n, rank", [(5, 1), (6, 1), (10, 2), (20, 6), (64, 24)])
def test_the_interval_takes_the_exact_binomial_ranks(n, rank):
    """The interval [x_(r), x_(n+1-r)] with the largest r whose tail P(Binomial(n, 1/2) < r) <= 2.5%:
    6 -> the whole range (1/64 each side), 10 -> 2nd and 9th, 20 -> 6th and 15th, 64 -> 24th and 41st; below
    6 values no rank qualifies and the interval is the whole range."""
    low, mid, high = median_interval([float(v) for v in range(1, n + 1)])
    assert (low, high) == (rank, n + 1 - rank) and mid == (n + 1) / 2
    tail = sum(math.comb(n, i) for i in range(rank)) / 2 ** n
    assert (tail <= 0.025 or n < 6) and (rank == 1 or tail + math.comb(n, rank) / 2 ** n > 0.025)


def test_interleaving_alternates_the_order_and_stops_when_the_interval_is_narrow():
    calls = []

    def timer(name, values):
        values = itertools.cycle(values)
        return lambda: calls.append(name) or next(values)

    before, after = interleave(timer("before", [2.0]), timer("after", [1.0]))
    assert len(before) == len(after) == MIN_ROUNDS  # identical rounds: narrow as soon as allowed
    assert calls[:4] == ["before", "after", "after", "before"]
    assert PairedTiming.of(before, after).ratio == pytest.approx(2.0)

    noisy = timer("after", [1.0, 1.5, 0.7, 1.2, 0.9])  # +-40%: never within 3%, so the cap ends it
    before, after = interleave(timer("before", [1.0]), noisy, max_rounds=20)
    timing = PairedTiming.of(before, after)
    assert len(before) == 20 and not timing.converged and timing.low < timing.ratio < timing.high


def test_a_time_budget_ends_the_rounds():
    readings = itertools.chain([0.0], itertools.repeat(100.0))  # the budget has run out after the first round
    noisy = itertools.cycle([1.0, 1.5, 0.7])
    before, after = interleave(lambda: 1.0, lambda: next(noisy), budget_s=3.0, clock=lambda: next(readings),
                               max_rounds=1000)
    assert len(before) == len(after) == MIN_ROUNDS  # never fewer than the minimum


def test_one_run_times_both_kernels_interleaved():
    pair = measure_pair(ACD, ADC, reference, protocol=ONE)
    assert pair.error is None and pair.rounds >= MIN_ROUNDS and len(pair.timings["before"]) == pair.rounds
    ratios = log_ratios(pair.timings["before"], pair.timings["after"])
    assert pair.ratio == pytest.approx(math.exp(median_interval(ratios)[1]))
    assert pair.low <= pair.ratio <= pair.high and pair.before_s > 0 and pair.after_s > 0
    assert pair.converged == (max(pair.ratio / pair.low, pair.high / pair.ratio) <= 1.03 + 1e-12)
    again = PairedTiming.from_dict(pair.to_dict())
    assert (again.ratio, again.low, again.rounds, again.converged) == (pair.ratio, pair.low, pair.rounds,
                                                                       pair.converged)


def test_a_program_that_does_not_build_is_a_failed_pair_not_an_exception():
    broken = Program.parse("L^{48}_{a=0}L^{48}_{c=0}L^{48}_{d=0}" + BODY, SIG)
    pair = measure_pair(ACD, broken, reference, target="nonsense", protocol=ONE)
    assert pair.ratio is None and pair.error.startswith("build failed") and not pair.converged


def test_a_program_against_itself_is_about_one():
    """The estimator has no bias of its own: the same kernel on both sides (microseconds per run, where a
    clock read around each call would dominate) comes out at a ratio near 1."""
    pair = measure_pair(ADC, ADC, reference, protocol=ONE)
    assert pair.error is None and 0.9 < pair.ratio < 1.1, pair.to_dict()


def test_long_kernels_are_timed_by_direct_calls_without_tvm_s_untimed_run(monkeypatch):
    """At `DIRECT_TIMING_S` a timing is the runs themselves (TVM's evaluator would run the kernel once more,
    untimed, at every call); below it TVM's evaluator times in C++. Either way the run clock counts the time."""
    from steptp_env.measure.build import DIRECT_TIMING_S, RunClock, build

    kernel = build(ACD)
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((48, 48)).astype("float32") for name in ("A", "B")}
    made, real = [], kernel._evaluator
    monkeypatch.setattr(kernel, "_evaluator", lambda *args: made.append(args) or real(*args))
    before = RunClock.seconds
    direct = kernel.timer(inputs, 3, probe_s=DIRECT_TIMING_S)
    assert all(direct() > 0 for _ in range(4)) and made == [] and RunClock.seconds > before
    kernel.timer(inputs, 3, probe_s=DIRECT_TIMING_S / 2)()
    assert made == [(3, 1)]


def test_the_direct_path_against_itself_is_about_one(monkeypatch):
    """The same on the direct path (forced here for any kernel, so the test does not depend on how fast
    the machine runs one): the worker's paired rounds, timed around direct calls."""
    import importlib

    from steptp_env.measure import worker

    build = importlib.import_module("steptp_env.measure.build")  # the module (the package exports `build()`)
    monkeypatch.setattr(build, "DIRECT_TIMING_S", 0.0)
    key = worker.kernel_key(ADC, "llvm")
    worker._ensure_built(key, ADC.leir, ADC.signature.to_json(), "llvm")
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((48, 48)).astype("float32") for name in ("A", "B")}
    made, real = [], build.Kernel._evaluator
    monkeypatch.setattr(build.Kernel, "_evaluator", lambda self, *args: made.append(args) or real(self, *args))
    times = worker._time_pair(key, key, inputs, 1e-4, 0.03, 64, 4.0)
    pair = PairedTiming.of(times["before"], times["after"])
    assert made == [(1, 1)] * 2  # only the probes use TVM's evaluator
    assert 0.9 < pair.ratio < 1.1, pair.to_dict()


def test_paired_timings_of_kernels_built_in_this_process_alternate_and_restore_the_affinity():
    """`worker.paired_timings` is the worker's paired timing for kernels held anywhere (benchmarks/opt_level.py
    times its own builds with it): as many timings of each, every one positive, and at one thread the
    calling thread's cores are the same after it as before."""
    import os

    from steptp_env.measure.build import build
    from steptp_env.measure.worker import paired_timings

    kernels = [build(ACD), build(ADC)]
    for kernel in kernels:
        kernel.link()
        assert kernel._main is not None  # linked before any run
    rng = np.random.default_rng(1)
    inputs = {name: rng.standard_normal((48, 48)).astype("float32") for name in ("A", "B")}
    cores = os.sched_getaffinity(0)
    before, after = paired_timings(kernels, inputs, 1e-4, threads=1, max_rounds=8)
    assert MIN_ROUNDS <= len(before) == len(after) <= 8 and min(before + after) > 0
    assert os.sched_getaffinity(0) == cores
