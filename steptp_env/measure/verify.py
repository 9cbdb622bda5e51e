"""Numeric equivalence of a program with a reference (a NumPy callable, another program, or a workload).

A wrong program is a result, not an exception: `verify` returns a `VerifyReport` saying why it failed.
Tolerances are defined in `tolerance.py`.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

import numpy as np

from ..errors import StepTPError
from ..ir.analysis import reduction_length, unwritten_reads
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .build import Kernel, build
from .inputs import random_inputs
from .tolerance import relative_tolerance

Reference = Union[Program, Callable[[dict[str, np.ndarray]], Any], Any]


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of comparing a program with its reference over several random input draws."""

    equivalent: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    first_mismatch: tuple[str, tuple[int, ...]] | None = None
    reason: str = ""
    trials: int = 0
    rtol: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"equivalent": self.equivalent, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "first_mismatch": None if self.first_mismatch is None else [self.first_mismatch[0],
                                                                            list(self.first_mismatch[1])],
                "reason": self.reason, "trials": self.trials, "rtol": dict(self.rtol)}


def _reference_runner(program: Program, reference: Reference, target: str, build_program: bool = True,
                      opt_level: int | None = None):
    """(make_inputs(seed), run(inputs) -> outputs by name, reduction length of the reference). A reference
    program is built here unless `build_program` is false (the caller runs it elsewhere; run is None)."""
    if isinstance(reference, Program):
        kernel = build(reference, target, opt_level) if build_program else None
        return (lambda seed: random_inputs(program, seed)), kernel, reduction_length(reference.nests)
    if hasattr(reference, "reference") and hasattr(reference, "make_inputs"):  # a Workload
        run = _named(program, reference.reference)
        return (lambda seed: _workload_case(reference, seed, run)[0],
                lambda inputs: _expected_for(reference, inputs, run), reduction_length(reference.program.nests))
    if callable(reference):
        return (lambda seed: random_inputs(program, seed)), _named(program, reference), 1
    raise StepTPError(f"cannot verify against {type(reference).__name__}: pass a Program, a workload or a callable")


_CASES: OrderedDict[tuple[int, int], tuple[Any, dict, dict]] = OrderedDict()
CASES_KEPT = 8
CASE_BYTES_KEPT = 1 << 28
"""A case holding more array bytes than this is not remembered: imported programs reach gigabytes, and eight
of them kept alive would exhaust memory."""


def _workload_case(workload, seed: int, run: Callable) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, reference outputs) of a workload for one seed, remembered for the last few: a search
    verifies many programs of one workload on the same seeded draws, and PyTorch's answer does not change.
    The arrays are read-only, so no caller can spoil a later comparison."""
    key = (id(workload), seed)
    hit = _CASES.get(key)
    if hit is None or hit[0] is not workload:
        inputs = workload.make_inputs(seed)
        expected = run(inputs)
        for array in (*inputs.values(), *expected.values()):
            array.flags.writeable = False
        if sum(a.nbytes for a in (*inputs.values(), *expected.values())) > CASE_BYTES_KEPT:
            return inputs, expected
        hit = _CASES[key] = (workload, inputs, expected)  # holding the workload keeps its id from reuse
        if len(_CASES) > CASES_KEPT:
            _CASES.popitem(last=False)
    _CASES.move_to_end(key)
    return hit[1], hit[2]


def _expected_for(workload, inputs: dict[str, np.ndarray], run: Callable) -> dict[str, np.ndarray]:
    """The reference outputs for `inputs`: remembered when they are a cached draw, else computed."""
    for cached, case_inputs, expected in list(_CASES.values()):
        if cached is workload and case_inputs is inputs:
            return expected
    return run(inputs)


def _named(program: Program, fn: Callable) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    names = [s.name for s in program.signature.outputs]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = fn({k: v.copy() for k, v in inputs.items()})
        if isinstance(result, Mapping):
            return {n: np.asarray(result[n]) for n in names}
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) != len(names):
            raise StepTPError(f"the reference returned {len(result)} outputs, the program has {len(names)}")
        return {n: np.asarray(r) for n, r in zip(names, result)}

    return run


Runner = Callable[[list[dict[str, np.ndarray]]], list[tuple[dict[str, np.ndarray], list[str]]]]
"""Runs the program on input sets elsewhere: (outputs, names of the inputs the kernel changed) per set."""


def precheck(program: Program) -> VerifyReport | None:
    """The failed report of a program that reads elements of an intermediate that no nest wrote
    (`unwritten_reads`), else None. Such a program fails before it runs: its outputs depend on what the
    allocator left in memory, so a run can pass by luck (x - x is 0 for most garbage, NaN for some) and the
    next one fail."""
    unwritten = unwritten_reads(program)
    if not unwritten:
        return None
    nest, access = unwritten[0]
    return VerifyReport(False, reason=f"nest {nest} reads {print_expr(access)} at elements that no earlier "
                                      "nest wrote (uninitialised memory)", trials=0)


def verify(program: Program, reference: Reference, trials: int = 3, seed: int = 0, target: str = "llvm",
           kernel: Kernel | None = None, runner: Runner | None = None,
           run_reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
           opt_level: int | None = None, prechecked: bool = False) -> VerifyReport:
    """Run `program` and `reference` on `trials` fresh seeded input draws and compare every output.

    Each run gets its own copies of the inputs, so a kernel that writes an input cannot affect the other
    side, and is caught. `runner` runs the program elsewhere (a worker process), and `run_reference`
    a reference program (inputs -> outputs by name); by default they are built and run here, with LLVM
    at `opt_level` (see `build`). Small draws run in one `runner` call (`BATCH_BYTES`); larger ones are taken
    one at a time, so only one draw's arrays are alive at once (imported programs reach GiB).

    `precheck` comes first (unless the caller ran it already, `prechecked`): a program that reads
    uninitialised memory fails before it is built.
    """
    early = None if prechecked else precheck(program)
    if early is not None:
        return early
    make_inputs, default_reference, ref_length = _reference_runner(
        program, reference, target, build_program=run_reference is None, opt_level=opt_level)
    run_reference = run_reference or default_reference
    if runner is None:
        kernel = kernel or build(program, target, opt_level)
        runner = lambda sets: [kernel.run_checked(s) for s in sets]  # noqa: E731
    length = max(reduction_length(program.nests), ref_length)
    rtols = {s.name: relative_tolerance(s.dtype, length) for s in program.signature.outputs}
    worst_abs = worst_rel = 0.0
    for trial, inputs, (outputs, changed) in _trial_runs(make_inputs, runner, seed, trials):
        if changed:
            return VerifyReport(False, reason=f"the kernel modified its input {changed[0]}", trials=trial + 1,
                                rtol=rtols)
        expected = run_reference(inputs)
        for spec in program.signature.outputs:
            verdict = compare(outputs[spec.name], expected[spec.name], rtols[spec.name])
            worst_abs, worst_rel = max(worst_abs, verdict.max_abs_err), max(worst_rel, verdict.max_rel_err)
            if not verdict.equivalent:
                mismatch = (spec.name, verdict.first_mismatch[1]) if verdict.first_mismatch else None
                return VerifyReport(False, worst_abs, worst_rel, mismatch,
                                    f"output {spec.name}, trial {trial}: {verdict.reason}", trial + 1, rtols)
        del inputs, outputs, expected
    return VerifyReport(True, worst_abs, worst_rel, None, "", trials, rtols)


BATCH_BYTES = 1 << 26
"""Input draws are run in one `runner` call when all of them together hold at most this many bytes: a
worker's round trip is paid once, not once per draw; larger draws are taken and run one at a time."""


def _trial_runs(make_inputs: Callable[[int], dict[str, np.ndarray]], runner: Runner, seed: int, trials: int):
    """(trial, inputs, (outputs, names of changed inputs)) for each seeded draw, in order."""
    first = make_inputs(seed * 1000)
    if trials > 1 and sum(np.asarray(a).nbytes for a in first.values()) * trials <= BATCH_BYTES:
        draws = [first, *(make_inputs(seed * 1000 + trial) for trial in range(1, trials))]
        yield from ((trial, draw, run) for trial, (draw, run) in enumerate(zip(draws, runner(draws))))
        return
    yield 0, first, runner([first])[0]
    del first
    for trial in range(1, trials):
        inputs = make_inputs(seed * 1000 + trial)
        yield trial, inputs, runner([inputs])[0]


CHUNK = 1 << 22
"""Elements compared at a time: the comparison works in float64 with several temporaries, which for a whole
GiB-sized output would take over ten times its size."""


def compare(actual: np.ndarray, expected: np.ndarray, rtol: float) -> VerifyReport:
    """Compare one output with its expected value under the rule in `tolerance.py`, `CHUNK` elements at
    a time."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        if actual.size == expected.size:
            expected = expected.reshape(actual.shape)
        else:
            return VerifyReport(False, reason=f"shape {actual.shape} differs from the reference's {expected.shape}")
    flat_a, flat_e = actual.reshape(-1), expected.reshape(-1)
    chunks = [(lo, min(lo + CHUNK, flat_a.size)) for lo in range(0, flat_a.size, CHUNK)]
    where = lambda flat: tuple(int(i) for i in np.unravel_index(flat, actual.shape))  # noqa: E731
    if not is_float(str(actual.dtype)):
        count, first = 0, None
        for lo, hi in chunks:
            bad = flat_a[lo:hi] != flat_e[lo:hi].astype(actual.dtype)
            count += int(bad.sum())
            if first is None and bad.any():
                first = lo + int(np.argmax(bad))
        if count:
            return VerifyReport(False, 0.0, 0.0, ("", where(first)), f"{count} integer element(s) differ")
        return VerifyReport(True)
    # first pass: NaN/inf positions must agree; the mean magnitude of the finite expected values. Most
    # outputs are finite everywhere: their chunks skip the NaN/inf bookkeeping, and a single chunk's
    # float64 differences and magnitudes serve the second pass as well. `total` sums |expected| / size,
    # which no float64 values can overflow.
    special_count, first, total, finite_count = 0, None, 0.0, 0
    kept = None
    for lo, hi in chunks:
        diff, magnitude, finite, magnitude_sum = _differences(flat_a, flat_e, lo, hi)
        if finite is None:
            total += magnitude_sum / flat_a.size
            finite_count += hi - lo
        else:
            odd = np.flatnonzero(~finite)
            oa, oe = flat_a[lo:hi][odd].astype(np.float64), flat_e[lo:hi][odd].astype(np.float64)
            nan_a, nan_e = np.isnan(oa), np.isnan(oe)
            bad_special = (nan_a != nan_e) | (~(nan_a | nan_e) & (oa != oe))  # both sides here are NaN or inf
            special_count += int(bad_special.sum())
            if first is None and bad_special.any():
                first = lo + int(odd[np.argmax(bad_special)])
            total += float((magnitude[finite] / flat_a.size).sum())
            finite_count += int(finite.sum())
        kept = (diff, magnitude, finite) if len(chunks) == 1 else None
    if special_count:
        return VerifyReport(False, float("inf"), float("inf"), ("", where(first)),
                            f"{special_count} NaN/inf position(s) differ")
    scale = total * (flat_a.size / max(1, finite_count))
    # second pass: every finite element within rtol * (|expected| + mean |expected|)
    max_abs = max_rel = 0.0
    bad_count, first, detail = 0, None, ""
    for lo, hi in chunks:
        diff, magnitude, finite = kept or _differences(flat_a, flat_e, lo, hi)[:3]
        if finite is not None:
            diff, magnitude = np.where(finite, diff, 0.0), np.where(finite, magnitude, 0.0)
        allowed = magnitude * rtol  # rtol * (|expected| + scale), in an order that stays finite
        allowed += scale * rtol
        max_abs = max(max_abs, float(diff.max()))
        relative = np.maximum(magnitude, np.finfo(np.float64).tiny)
        np.divide(diff, relative, out=relative)
        max_rel = max(max_rel, float(relative.max()))
        bad = diff > allowed
        count = int(np.count_nonzero(bad))
        bad_count += count
        if first is None and count:
            i = int(np.argmax(bad))
            first = lo + i
            detail = f"{float(flat_a[first]):.9g} vs {float(flat_e[first]):.9g} (allowed {float(allowed[i]):.3g})"
    if bad_count:
        return VerifyReport(False, max_abs, max_rel, ("", where(first)),
                            f"{bad_count} element(s) off; at {where(first)}: {detail}")
    return VerifyReport(True, max_abs, max_rel)


def _differences(flat_a: np.ndarray, flat_e: np.ndarray, lo: int, hi: int):
    """(|actual - expected|, |expected|, where both are finite, the sum of |expected|) of elements lo:hi in
    float64; the mask is None when every element of both is finite. Finite sums tell that without a
    mask: float32 values cannot overflow a float64 sum, and one NaN or inf makes a sum NaN or inf (a
    float64 sum that overflows takes the exact path, with the same answer)."""
    a = flat_a[lo:hi]
    magnitude = flat_e[lo:hi].astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf where both sides agree on an inf
        diff = np.subtract(a, magnitude, dtype=np.float64)
    np.abs(diff, out=diff)
    np.abs(magnitude, out=magnitude)
    with np.errstate(over="ignore", invalid="ignore"):  # inf + -inf is NaN: not finite, as wanted
        magnitude_sum, actual_sum = float(magnitude.sum()), float(np.add.reduce(a, dtype=np.float64))
    if np.isfinite(magnitude_sum) and np.isfinite(actual_sum):
        return diff, magnitude, None, magnitude_sum
    finite = np.isfinite(a)
    finite &= np.isfinite(magnitude)
    return diff, magnitude, finite, magnitude_sum
