"""float32 exp, log and erf lowered as vectorisable arithmetic (steptp_env/lower/vector_math.py): accuracy
over each function's whole float32 domain, IEEE special values, and no libm call left in a vector loop."""
from __future__ import annotations

import math

import numpy as np
import pytest

from steptp_env import Program, build

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e-45, 1.1754944e-38, 88.72, 88.73, -103.9,
                    -104.5, 0.5, -0.5, 1.0, 1e-8, -1e-8], dtype=np.float32)


def _apply(func: str, xs: np.ndarray) -> tuple[np.ndarray, str]:
    """func over xs in a `V^{16}` loop: (results, the kernel's assembly)."""
    signature = [{"name": "A", "shape": [xs.size], "dtype": "float32"},
                 {"name": "C", "shape": [xs.size], "dtype": "float32", "role": "output"}]
    program = Program.parse(f"L^{{{xs.size // 16}}}_{{a=0}}V^{{16}}_{{b=0}}"
                            f"[C^{{f32,g}}_{{a*16+b}}={func}(A^{{f32,g}}_{{a*16+b}});];", signature)
    kernel = build(program)
    return kernel({"A": xs})["C"], kernel.executable.mod.inspect_source("asm")


def _inputs(func: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if func == "log":  # every binade from subnormals to the largest finite values
        xs = np.exp2(rng.uniform(-149, 128, 1 << 18)).astype(np.float32)
    else:
        low, high = {"exp": (-110, 90), "erf": (-6, 6)}[func]
        xs = rng.uniform(low, high, 1 << 18).astype(np.float32)
    xs[:SPECIAL.size] = SPECIAL
    return xs


def _reference(func: str, xs: np.ndarray) -> np.ndarray:
    x = xs.astype(np.float64)
    with np.errstate(all="ignore"):
        if func == "exp":
            return np.exp(x)
        if func == "log":
            return np.log(x)
    return np.array([math.erf(v) if not np.isinf(v) else np.sign(v) for v in x])


@pytest.mark.parametrize("func", ["exp", "log", "erf"])
def test_vector_math_is_accurate_and_keeps_special_values(func):
    xs = _inputs(func)
    got, asm = _apply(func, xs)
    exact = _reference(func, xs)
    with np.errstate(over="ignore"):
        rounded = exact.astype(np.float32)
    # NaN and infinities exactly where float32 rounding of the exact result puts them
    np.testing.assert_array_equal(np.isnan(got), np.isnan(rounded))
    np.testing.assert_array_equal(got[np.isinf(rounded)], rounded[np.isinf(rounded)])
    finite = np.isfinite(rounded)
    assert np.isfinite(got[finite]).all()
    error = np.abs(got[finite].astype(np.float64) - exact[finite])
    ulps = error / np.spacing(np.abs(rounded[finite]))
    if func == "erf":
        assert error.max() <= 3e-7
        near_zero = np.abs(xs[finite]) < 0.5
        assert ulps[near_zero].max() <= 3
    else:
        assert ulps.max() <= 2
    assert f"{func}f" not in asm  # no call to libm's scalar function: the loop is vector code


def test_float64_keeps_libm():
    """Only float32 takes the polynomial forms: float64 programs keep TVM's lowering to libm's exp and log."""
    signature = [{"name": "A", "shape": [64], "dtype": "float64"},
                 {"name": "C", "shape": [64], "dtype": "float64", "role": "output"}]
    program = Program.parse("L^{64}_{a=0}[C^{f64,g}_{a}=exp(A^{f64,g}_{a})+log(A^{f64,g}_{a});];", signature)
    xs = np.random.default_rng(1).uniform(0.1, 10, 64)
    kernel = build(program)
    expected = [math.exp(x) + math.log(x) for x in xs]  # Python's math calls libm
    np.testing.assert_allclose(kernel({"A": xs})["C"], expected, rtol=1e-15)
    asm = kernel.executable.mod.inspect_source("asm")
    assert "exp@" in asm and "log@" in asm


def test_tvm_form_keeps_tvm_math_intrinsics():
    """MetaSchedule's flop estimator rejects `Let`: TVM's tools get `T.exp` (lower(..., tvm_form=True))."""
    from steptp_env import lower

    signature = [{"name": "A", "shape": [64], "dtype": "float32"},
                 {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]
    program = Program.parse("L^{64}_{a=0}[C^{f32,g}_{a}=exp(A^{f32,g}_{a});];", signature)
    assert "T.exp(" in lower(program, tvm_form=True).script()
    assert "T.exp(" not in lower(program).script()


def test_nested_calls_stay_linear_in_size():
    """Each polynomial form reads its argument several times, and TVM's code generator substitutes `Let`
    values while it simplifies, so every expanded level multiplies the size of those inside it (`mish`,
    `logcumsumexp` took minutes to build). Six nested calls must still build, and stay correct."""
    from steptp_env import lower

    signature = [{"name": "A", "shape": [64], "dtype": "float32"},
                 {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]
    inner = "A^{f32,g}_{a}"
    for func in ("exp", "log", "erf", "exp", "log", "erf"):
        inner = f"{func}({inner}*0.5)"
    program = Program.parse(f"L^{{64}}_{{a=0}}[C^{{f32,g}}_{{a}}={inner};];", signature)
    assert len(lower(program).script()) < 30_000
    assert "T.exp(" in lower(program).script()  # the outer levels keep libm
    xs = np.random.default_rng(2).uniform(0.5, 2, 64).astype(np.float32)
    expected = xs.astype(np.float64)
    for func in ("exp", "log", "erf", "exp", "log", "erf"):
        expected = {"exp": np.exp, "log": np.log, "erf": np.vectorize(math.erf)}[func](expected * 0.5)
    np.testing.assert_allclose(build(program)({"A": xs})["C"], expected, rtol=1e-5)


def test_scalar_reductions_keep_libm():
    """The polynomial forms pay off only in vector code: a statement whose innermost loop accumulates into
    one element stays scalar (LLVM does not reassociate float sums) and keeps libm's table-driven expf,
    while a plain loop over distinct elements takes the polynomial form and LLVM vectorises it (lowering 4).
    Both compute the same values."""
    signature = [{"name": "A", "shape": [4, 64], "dtype": "float32"},
                 {"name": "C", "shape": [4], "dtype": "float32", "role": "output"},
                 {"name": "D", "shape": [4, 64], "dtype": "float32", "role": "output"}]
    xs = np.random.default_rng(3).uniform(-5, 5, (4, 64)).astype(np.float32)
    summed = Program.parse("L^{4}_{a=0}L^{64}_{b=0}[C^{f32,g}_{a}=C^{f32,g}_{a}+exp(A^{f32,g}_{a,b});];"
                           "L^{4}_{a=0}L^{64}_{b=0}[D^{f32,g}_{a,b}=A^{f32,g}_{a,b};];", signature)
    mapped = Program.parse("L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a,0};];"
                           "L^{4}_{a=0}L^{64}_{b=0}[D^{f32,g}_{a,b}=exp(A^{f32,g}_{a,b});];", signature)
    for program, libm in ((summed, True), (mapped, False)):
        kernel = build(program)
        out = kernel({"A": xs})
        expected_sum = np.exp(xs.astype(np.float64)).sum(axis=1)
        if libm:
            np.testing.assert_allclose(out["C"], expected_sum, rtol=1e-5)
        else:
            np.testing.assert_allclose(out["D"], np.exp(xs.astype(np.float64)), rtol=1e-6)
        assert ("expf" in kernel.executable.mod.inspect_source("asm")) is libm


@pytest.mark.parametrize("func", ["exp", "log", "erf"])
def test_tvm_vectorises_the_loop_itself(func):
    """TVM, not LLVM's loop vectoriser, makes the `V^{16}` loop vector code: at LLVM opt level 0 (no
    vectoriser) the module already holds 16-lane operations of the form (TVM 0.27 turned the loop serial
    while `reinterpret` and `isnan` lacked the vectorisable mark, and LLVM took it at 8 lanes)."""
    signature = [{"name": "A", "shape": [64], "dtype": "float32"},
                 {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]
    program = Program.parse(f"L^{{4}}_{{a=0}}V^{{16}}_{{b=0}}[C^{{f32,g}}_{{a*16+b}}={func}(A^{{f32,g}}_{{a*16+b}});];",
                            signature)
    kernel = build(program, opt_level=0)
    llvm_ir = kernel.source
    assert "<16 x float>" in llvm_ir and "<16 x i32>" in llvm_ir  # the arithmetic and the exponent bits
    assert "fmuladd.f32" not in llvm_ir  # no scalar polynomial left
    xs = _inputs(func)[:64]
    got = kernel({"A": xs})["C"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(_apply(func, xs)[0]))
