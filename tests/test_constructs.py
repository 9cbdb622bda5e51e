"""Construct by construct, three semantics of LEIR must agree: NumPy written by hand, the NumPy
interpreter (`steptp_env.ir.interpret`), and the TVM lowering built for the CPU (`run` checks the last two
against each other before the test compares with the hand-written expectation)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from steptp_env.ir import Program
from steptp_env.ir.interpret import interpret
from steptp_env.measure import build

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "steptp-ref" / "programs.jsonl"
rng = np.random.default_rng(0)


def spec(name: str, shape: tuple[int, ...], dtype: str = "float64", role: str = "input") -> dict:
    return {"name": name, "shape": list(shape), "dtype": dtype, "role": role}


def run(leir: str, signature: list[dict], **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """The interpreter's outputs, after checking that the compiled TVM kernel computes the same."""
    program = Program.parse(leir, signature)
    expected = interpret(program, inputs)
    compiled = build(program, "llvm")(inputs)
    for name, value in expected.items():
        assert compiled[name].dtype == value.dtype, name
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(compiled[name], value, rtol=1e-6 if value.dtype == np.float32 else 1e-12,
                                       atol=1e-12, err_msg=f"TVM and the interpreter disagree on {name}")
        else:
            np.testing.assert_array_equal(compiled[name], value, err_msg=f"TVM and the interpreter disagree on {name}")
    return expected


def uniform(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape)


# -- reductions ------------------------------------------------------------------------------------------

def test_matmul_reduction():
    a, w = uniform(3, 5), uniform(5, 4)
    out = run("L^{3}_{a=0}L^{4}_{c=0}L^{5}_{d=0}[C^{f64,g}_{a,c}=C^{f64,g}_{a,c}+A^{f64,g}_{a,d}*W^{f64,g}_{d,c};];",
              [spec("A", (3, 5)), spec("W", (5, 4)), spec("C", (3, 4), role="output")], A=a, W=w)
    np.testing.assert_allclose(out["C"], a @ w, rtol=1e-12)
    assert out["C"].dtype == np.float64 and out["C"].shape == (3, 4)


@pytest.mark.parametrize("rhs, lo, hi, expected", [
    ("max(D^{f64,g}_{a},A^{f64,g}_{a,c})", -3.0, -1.0, lambda x: x.max(1)),  # identity -inf, not 0
    ("max(A^{f64,g}_{a,c},D^{f64,g}_{a})", -3.0, -1.0, lambda x: x.max(1)),
    ("min(D^{f64,g}_{a},A^{f64,g}_{a,c})", 1.0, 3.0, lambda x: x.min(1)),  # identity +inf, not 0
    ("D^{f64,g}_{a}*A^{f64,g}_{a,c}", 0.5, 2.0, lambda x: x.prod(1)),  # identity 1
    ("A^{f64,g}_{a,c}*D^{f64,g}_{a}", 0.5, 2.0, lambda x: x.prod(1)),
    ("D^{f64,g}_{a}-A^{f64,g}_{a,c}", -1.0, 1.0, lambda x: -x.sum(1)),
    ("A^{f64,g}_{a,c}+D^{f64,g}_{a}", -1.0, 1.0, lambda x: x.sum(1)),
])
def test_reduction_operators(rhs, lo, hi, expected):
    a = uniform(3, 4, lo=lo, hi=hi)
    out = run(f"L^{{3}}_{{a=0}}L^{{4}}_{{c=0}}[D^{{f64,g}}_{{a}}={rhs};];",
              [spec("A", (3, 4)), spec("D", (3,), role="output")], A=a)
    np.testing.assert_allclose(out["D"], expected(a), rtol=1e-12)


def test_integer_max_reduction_starts_from_the_dtype_minimum():
    i = rng.integers(-100, -1, (3, 4))
    out = run("L^{3}_{a=0}L^{4}_{c=0}[D^{i32,g}_{a}=max(D^{i32,g}_{a},I^{i32,g}_{a,c});];",
              [spec("I", (3, 4), "int32"), spec("D", (3,), "int32", "output")], I=i)
    np.testing.assert_array_equal(out["D"], i.max(1))


def test_reduction_into_an_offset_subscript():
    a = uniform(3, 4)
    out = run("L^{3}_{c=0}L^{4}_{d=0}[E^{f64,g}_{c+2}=E^{f64,g}_{c+2}+A^{f64,g}_{c,d};];"
              "L^{3}_{c=0}[D^{f64,g}_{c}=E^{f64,g}_{c+2};];",
              [spec("A", (3, 4)), spec("D", (3,), role="output")], A=a)
    np.testing.assert_allclose(out["D"], a.sum(1), rtol=1e-12)


def test_reduction_over_an_outer_loop_of_an_inner_nest():
    # O_{d} is reduced over c, an outer loop: it starts once per nest execution, not once per c
    a = uniform(3, 4)
    out = run("L^{3}_{c=0}[L^{4}_{d=0}[O^{f64,g}_{d}=O^{f64,g}_{d}+A^{f64,g}_{c,d};];];",
              [spec("A", (3, 4)), spec("O", (4,), role="output")], A=a)
    np.testing.assert_allclose(out["O"], a.sum(0), rtol=1e-12)


def test_fresh_accumulation_after_reduction_factorization():
    a, w = uniform(2, 5), uniform(5, 3)
    out = run("L^{2}_{a=0}L^{3}_{c=0}L^{3}_{d=0}[E^{f64,g}_{a,c}=E^{f64,g}_{a,c}+A^{f64,g}_{a,d}*W^{f64,g}_{d,c};];"
              "L^{2}_{a=0}L^{3}_{c=0}L^{2}_{d=0}[F^{f64,g}_{a,c}=F^{f64,g}_{a,c}+A^{f64,g}_{a,d+3}*W^{f64,g}_{d+3,c};];"
              "L^{2}_{a=0}L^{3}_{c=0}[D^{f64,g}_{a,c}=D^{f64,g}_{a,c}+(E^{f64,g}_{a,c}+F^{f64,g}_{a,c});];",
              [spec("A", (2, 5)), spec("W", (5, 3)), spec("D", (2, 3), role="output")], A=a, W=w)
    np.testing.assert_allclose(out["D"], a @ w, rtol=1e-12)


def test_update_of_a_written_tensor_reads_the_stored_value():
    a, w, z = uniform(2, 5), uniform(5, 3), uniform(3)
    out = run("L^{2}_{a=0}L^{3}_{c=0}L^{5}_{d=0}[C^{f64,g}_{a,c}=C^{f64,g}_{a,c}+A^{f64,g}_{a,d}*W^{f64,g}_{d,c};];"
              "L^{2}_{a=0}L^{3}_{c=0}[C^{f64,g}_{a,c}=C^{f64,g}_{a,c}+Z^{f64,g}_{c};];",
              [spec("A", (2, 5)), spec("W", (5, 3)), spec("Z", (3,)), spec("C", (2, 3), role="output")],
              A=a, W=w, Z=z)
    np.testing.assert_allclose(out["C"], a @ w + z, rtol=1e-12)


# -- scans and guarded reads ----------------------------------------------------------------------------

@pytest.mark.parametrize("rhs, lo, expected", [
    ("F^{f64,g}_{a-1}+A^{f64,g}_{a}", -1.0, np.cumsum),
    ("if_then_else(a-1<0,0,F^{f64,g}_{a-1})+A^{f64,g}_{a}", -1.0, np.cumsum),
    ("F^{f64,g}_{a-1}*A^{f64,g}_{a}", 0.5, np.cumprod),  # unguarded: the identity of * is 1
    ("max(F^{f64,g}_{a-1},A^{f64,g}_{a})", -3.0, np.maximum.accumulate),  # ... of max is -inf
    ("max(if_then_else(a-1<0,-inf,F^{f64,g}_{a-1}),A^{f64,g}_{a})", -3.0, np.maximum.accumulate),
])
def test_prefix_scan(rhs, lo, expected):
    a = uniform(6, lo=lo, hi=lo + 2)
    out = run(f"L^{{6}}_{{a=0}}[F^{{f64,g}}_{{a}}={rhs};];", [spec("A", (6,)), spec("F", (6,), role="output")], A=a)
    np.testing.assert_allclose(out["F"], expected(a), rtol=1e-12)


def test_scan_along_a_reversed_index():
    a = uniform(5)
    out = run("L^{5}_{a=0}[F^{f64,g}_{4-a}=F^{f64,g}_{5-a}+A^{f64,g}_{4-a};];",
              [spec("A", (5,)), spec("F", (5,), role="output")], A=a)
    np.testing.assert_allclose(out["F"], np.cumsum(a[::-1])[::-1], rtol=1e-12)


def test_padding_reads_only_the_chosen_branch():
    a = uniform(4)
    out = run("L^{8}_{c=0}[D^{f64,g}_{c}=if_then_else(2<=c<6,A^{f64,g}_{c-2},0);];",
              [spec("A", (4,)), spec("D", (8,), role="output")], A=a)
    np.testing.assert_array_equal(out["D"], np.pad(a, 2))


def test_unguarded_out_of_bounds_read_raises():
    program = Program.parse("L^{4}_{c=0}[D^{f64,g}_{c}=A^{f64,g}_{c-1};];",
                            [spec("A", (4,)), spec("D", (4,), role="output")])
    with pytest.raises(IndexError, match="A"):
        interpret(program, {"A": uniform(4)})


# -- index tensors ---------------------------------------------------------------------------------------

def test_index_tensor_input():
    a, i = uniform(6), np.array([5, 0, 3, 3], dtype=np.int64)
    out = run("L^{4}_{c=0}[D^{f64,g}_{c}=A^{f64,g}_{I^{i64,g}_{c}};];",
              [spec("A", (6,)), spec("I", (4,), "int64"), spec("D", (4,), role="output")], A=a, I=i)
    np.testing.assert_array_equal(out["D"], a[i])


def test_precomputed_index_intermediate_read_and_written_through():
    a = uniform(6)
    out = run("L^{3}_{c=0}[K^{i64,g}_{c}=c*2+1;];"
              "L^{3}_{c=0}[D^{f64,g}_{c*2}=0;];"
              "L^{3}_{c=0}[D^{f64,g}_{K^{i64,g}_{c}}=A^{f64,g}_{K^{i64,g}_{c}}*10;];",
              [spec("A", (6,)), spec("D", (6,), role="output")], A=a)
    np.testing.assert_array_equal(out["D"], [0, a[1] * 10, 0, a[3] * 10, 0, a[5] * 10])


# -- values and types ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rhs, expected", [
    ("exp(A^{f64,g}_{c})", np.exp),
    ("log(A^{f64,g}_{c}+2)", lambda x: np.log(x + 2)),
    ("sqrt(A^{f64,g}_{c}+1)", lambda x: np.sqrt(x + 1)),
    ("abs(A^{f64,g}_{c})", np.abs),
    ("erf(A^{f64,g}_{c})", np.vectorize(math.erf)),
    ("max(A^{f64,g}_{c},0.25)", lambda x: np.maximum(x, 0.25)),
    ("min(0.25,A^{f64,g}_{c})", lambda x: np.minimum(x, 0.25)),
    ("A^{f64,g}_{c}**2", lambda x: x ** 2),
    ("(A^{f64,g}_{c}+2)**0.5", lambda x: (x + 2) ** 0.5),
    ("A^{f64,g}_{c}//0.3", lambda x: x // 0.3),
    ("A^{f64,g}_{c}%0.3", lambda x: x % 0.3),
    ("-A^{f64,g}_{c}/3", lambda x: -x / 3),
    ("A^{f64,g}_{c}*(1/2)", lambda x: x * 0.5),  # a literal-only subexpression divides as Python does
    ("c/2+A^{f64,g}_{c}", lambda x: np.arange(5) / 2 + x),  # a loop var as a value
    ("if_then_else(A^{f64,g}_{c}>0&c<3,1,2)", lambda x: np.where((x > 0) & (np.arange(5) < 3), 1.0, 2.0)),
])
def test_functions_and_operators(rhs, expected):
    a = uniform(5)
    out = run(f"L^{{5}}_{{c=0}}[D^{{f64,g}}_{{c}}={rhs};];", [spec("A", (5,)), spec("D", (5,), role="output")], A=a)
    np.testing.assert_allclose(out["D"], expected(a), rtol=1e-12)


@pytest.mark.parametrize("rhs, expected", [
    ("I^{i64,g}_{c}//3", lambda i: i // 3),  # floor, like Python: -7//3 == -3
    ("I^{i64,g}_{c}%3", lambda i: i % 3),  # -7%3 == 2
    ("I^{i64,g}_{c}**2", lambda i: i ** 2),
    ("I^{i64,g}_{c}/2*2", lambda i: i),  # true division, then truncated back into the integer target
    ("I^{i64,g}_{c}*2.6", lambda i: np.trunc(i * 2.6).astype(np.int64)),  # float to int truncates
])
def test_integer_arithmetic(rhs, expected):
    i = np.array([-7, -1, 0, 4, 9], dtype=np.int64)
    out = run(f"L^{{5}}_{{c=0}}[D^{{i64,g}}_{{c}}={rhs};];",
              [spec("I", (5,), "int64"), spec("D", (5,), "int64", "output")], I=i)
    assert out["D"].dtype == np.int64
    np.testing.assert_array_equal(out["D"], expected(i))


def test_float32_stays_float32_next_to_literals_and_integers():
    a, i = uniform(4).astype(np.float32), np.array([1, 2, 3, 4], dtype=np.int64)
    out = run("L^{4}_{c=0}[D^{f32,g}_{c}=A^{f32,g}_{c}*0.1+I^{i64,g}_{c}/3;];",
              [spec("A", (4,), "float32"), spec("I", (4,), "int64"), spec("D", (4,), "float32", "output")],
              A=a, I=i)
    expected = a * np.float32(0.1) + i.astype(np.float32) / np.float32(3)
    assert out["D"].dtype == np.float32
    np.testing.assert_array_equal(out["D"], expected)


def test_zero_dimensional_tensors():
    a, s = uniform(4), np.array(3.0)
    out = run("L^{4}_{c=0}[T^{f64,g}=T^{f64,g}+A^{f64,g}_{c};];L^{1}_{a=0}[D^{f64,g}=T^{f64,g}*S^{f64,g};];",
              [spec("A", (4,)), spec("S", ()), spec("D", (), role="output")], A=a, S=s)
    assert out["D"].shape == ()
    np.testing.assert_allclose(out["D"], a.sum() * 3.0, rtol=1e-12)


def test_bool_input_acts_as_zero_or_one():
    a, m = uniform(6), np.array([True, False, True, True, False, False])
    out = run("L^{6}_{c=0}[D^{f64,g}_{c}=A^{f64,g}_{c}*M^{bool,g}_{c}+(M^{bool,g}_{c}+M^{bool,g}_{c});];",
              [spec("A", (6,)), spec("M", (6,), "bool"), spec("D", (6,), role="output")], A=a, M=m)
    np.testing.assert_array_equal(out["D"], a * m + 2 * m)


def test_read_with_another_dtype_converts():
    out = run("L^{1}_{a=0}[R^{f64,g}=16.7;];L^{1}_{a=0}[D^{f64,g}=sqrt(R^{i32,g});];",
              [spec("D", (), role="output")])
    assert out["D"] == 4.0


# -- programs ----------------------------------------------------------------------------------------------

ARGMAX = ("B^{2}_{tx=0}L^{5}_{a=0}L^{3}_{c=0}[D^{f64,g}_{tx,c}=max(D^{f64,g}_{tx,c},A^{f64,g}_{tx,a,c});"
          "C^{i64,g}_{tx,c}=0;];B^{2}_{tx=0}L^{5}_{a=0}L^{3}_{c=0}[C^{i64,g}_{tx,c}=if_then_else("
          "A^{f64,g}_{tx,a,c}>=D^{f64,g}_{tx,c},a,C^{i64,g}_{tx,c});];")  # level1/46 with shapes shrunk


@pytest.mark.parametrize("a", [uniform(2, 5, 3), rng.integers(0, 2, (2, 5, 3)).astype(np.float64)])
def test_argmax_chooses_the_last_maximum(a):
    out = run(ARGMAX, [spec("A", (2, 5, 3)), spec("C", (2, 3), "int64", "output")], A=a)
    assert out["C"].dtype == np.int64
    np.testing.assert_array_equal(out["C"], 4 - np.argmax(a[:, ::-1, :], axis=1))


@pytest.mark.parametrize("leir", [
    "L^{2}_{c=0}[D^{f64,g}_{c}=0;L^{3}_{d=0}[D^{f64,g}_{c}=D^{f64,g}_{c}+A^{f64,g}_{c,d};];];",
    "L^{2}_{c=0}[D^{f64,g}_{c}=0;]L^{3}_{d=0}[D^{f64,g}_{c}=D^{f64,g}_{c}+A^{f64,g}_{c,d};];",
])
def test_inner_nest_forms(leir):
    a = uniform(2, 3)
    out = run(leir, [spec("A", (2, 3)), spec("D", (2,), role="output")], A=a)
    np.testing.assert_allclose(out["D"], a.sum(1), rtol=1e-12)


def test_inner_nest_runs_in_place_between_statements():
    a = uniform(2, 3)
    out = run("L^{2}_{c=0}[G^{f64,g}_{c}=1;L^{3}_{d=0}[G^{f64,g}_{c}=G^{f64,g}_{c}*2+A^{f64,g}_{c,d};];"
              "D^{f64,g}_{c}=G^{f64,g}_{c}*10;];",
              [spec("A", (2, 3)), spec("D", (2,), role="output")], A=a)
    g = np.ones(2)
    for d in range(3):
        g = g * 2 + a[:, d]
    np.testing.assert_allclose(out["D"], g * 10, rtol=1e-12)


def _corpus_rows(limit: int) -> list[dict]:
    if not CORPUS.exists():
        return []
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    return [r for r in rows if r["loop_iterations"] <= limit]


@pytest.mark.parametrize("row", _corpus_rows(3000), ids=lambda r: r["id"])
def test_reference_programs_run(row):
    program = Program.parse(row["leir"], row["signature"])
    inputs = {}
    for t in program.signature.inputs:
        if t.dtype == "bool":
            inputs[t.name] = rng.integers(0, 2, t.shape).astype(bool)
        elif t.dtype.startswith(("int", "uint")):
            inputs[t.name] = np.zeros(t.shape, dtype=t.dtype)
        else:
            inputs[t.name] = uniform(*t.shape).astype(t.dtype)
    out = interpret(program, inputs)
    assert set(out) == {t.name for t in program.signature.outputs}
    for t in program.signature.outputs:
        assert out[t.name].shape == t.shape and out[t.name].dtype == np.dtype(t.dtype)


# -- loop kinds and storage scopes -------------------------------------------------------------------------

@pytest.mark.parametrize("kinds", ["LL", "PL", "LV", "PV", "UL", "BL", "BU", "LP"])
def test_loop_kinds_do_not_change_results(kinds):
    a = uniform(4, 8)
    outer, inner = kinds
    var = "tx" if outer == "B" else "a"
    leir = (f"{outer}^{{4}}_{{{var}=0}}{inner}^{{8}}_{{c=0}}[D^{{f64,g}}_{{{var},c}}=exp(A^{{f64,g}}_{{{var},c}})*2;];"
            f"{outer}^{{4}}_{{{var}=0}}L^{{8}}_{{c=0}}[S^{{f64,g}}_{{{var}}}=S^{{f64,g}}_{{{var}}}+D^{{f64,g}}_{{{var},c}};];")
    out = run(leir, [spec("A", (4, 8)), spec("D", (4, 8), role="output"), spec("S", (4,), role="output")], A=a)
    np.testing.assert_allclose(out["D"], np.exp(a) * 2, rtol=1e-12)
    np.testing.assert_allclose(out["S"], (np.exp(a) * 2).sum(1), rtol=1e-12)


@pytest.mark.parametrize("scope", ["g", "l", "s"])
def test_storage_scopes_do_not_change_results(scope):
    a = uniform(4, 8)
    leir = (f"L^{{4}}_{{a=0}}L^{{8}}_{{c=0}}[M^{{f64,{scope}}}_{{a}}=max(M^{{f64,{scope}}}_{{a}},A^{{f64,g}}_{{a,c}});];"
            f"L^{{4}}_{{a=0}}L^{{8}}_{{c=0}}[D^{{f64,g}}_{{a,c}}=A^{{f64,g}}_{{a,c}}-M^{{f64,{scope}}}_{{a}};];")
    out = run(leir, [spec("A", (4, 8)), spec("D", (4, 8), role="output")], A=a)
    np.testing.assert_allclose(out["D"], a - a.max(1, keepdims=True), rtol=1e-12)
