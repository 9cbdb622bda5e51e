"""Signature checks, shape inference and parse errors: every error names what is wrong and where."""
from __future__ import annotations

import json

import pytest

from steptp_env.errors import ParseError, SignatureError, StepTPError
from steptp_env.ir import Program, Signature, TensorSpec
from steptp_env.ir.parser import parse_nests


def spec(name, shape, role="input", dtype="float64"):
    return {"name": name, "shape": list(shape), "dtype": dtype, "role": role}


# A: float64[4] input, W: float64[4,3] param, C: float64[4] output
SIG = [spec("A", [4]), spec("W", [4, 3], "param"), spec("C", [4], "output")]

COPY = "L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a};];"


def signature_error(text, signature=SIG) -> SignatureError:
    with pytest.raises(SignatureError) as info:
        Program.parse(text, signature)
    return info.value


def test_a_correct_program_passes():
    program = Program.parse(COPY, SIG)
    assert program.leir == COPY
    assert set(program.tensors) == {"A", "W", "C"} and program.intermediates == {}


# -- one test per kind ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, tensor", [
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{c};];", "c"),          # in a subscript on the right
    ("L^{4}_{a=0}[C^{f64,g}_{c}=A^{f64,g}_{a};];", "c"),          # in the written subscript
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a}*d;];", "d"),        # a loop var used as a value
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1;];L^{4}_{c=0}[C^{f64,g}_{c}=C^{f64,g}_{a};];", "a"),  # out of its nest
])
def test_undefined_name(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("undefined-name", tensor)


def test_undefined_name_reports_the_nest():
    err = signature_error("L^{4}_{a=0}[C^{f64,g}_{a}=1;];L^{4}_{c=0}[C^{f64,g}_{c}=C^{f64,g}_{a};];")
    assert err.nest == 1 and "nest 1" in str(err)


@pytest.mark.parametrize("text, tensor", [
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a,0};];", "A"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=W^{f64,g}_{a};];", "W"),
    ("L^{4}_{a=0}[C^{f64,g}=A^{f64,g}_{a};];", "C"),
])
def test_rank_mismatch(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("rank-mismatch", tensor)


@pytest.mark.parametrize("text, tensor, nest", [
    # an intermediate nobody writes
    ("L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{a};];", "X", 0),
    # an intermediate written only by a later nest
    ("L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{a};];L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];", "X", 0),
    # the output read in a nest before the nest that writes it
    ("L^{4}_{a=0}[X^{f64,g}_{a}=C^{f64,g}_{a};];L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a};];", "C", 0),
    # an index tensor nobody writes, read inside a subscript
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{K^{i64,g}_{a}};];", "K", 0),
])
def test_read_before_write(text, tensor, nest):
    err = signature_error(text)
    assert (err.kind, err.tensor, err.nest) == ("read-before-write", tensor, nest)


def test_an_unwritten_index_tensor_in_a_written_subscript_is_read_before_write():
    err = signature_error("L^{4}_{a=0}[C^{f64,g}_{K^{i64,g}_{a}}=A^{f64,g}_{a};];")
    assert (err.kind, err.tensor) == ("read-before-write", "K")


def test_reading_what_the_same_nest_writes_is_not_read_before_write():
    # an accumulation reads its own target; a later statement of the same nest reads an earlier one's target
    Program.parse("L^{4}_{a=0}L^{3}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+W^{f64,g}_{a,c};];", SIG)
    Program.parse("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};C^{f64,g}_{a}=X^{f64,g}_{a};];", SIG)


@pytest.mark.parametrize("text, tensor", [
    # a constant subscript of a signature tensor outside its shape
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{4};];", "A"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=W^{f64,g}_{a,3};];", "W"),
    # a write beyond an output's shape, with loop extents or with offsets
    ("L^{5}_{a=0}[C^{f64,g}_{a}=1;];", "C"),
    ("L^{4}_{a=0}[C^{f64,g}_{a+1}=1;];", "C"),
    ("L^{4}_{a=0}[C^{f64,g}_{a-1}=1;];", "C"),
    ("L^{4}_{a=0}[C^{f64,g}_{3-a}=A^{f64,g}_{a};C^{f64,g}_{4}=0;];", "C"),
    # a negative constant subscript
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{-1};];", "A"),
    # a constant read beyond the extent inferred for an intermediate (X gets shape (4,))
    ("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{4};];", "X"),
])
def test_out_of_bounds(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("out-of-bounds", tensor)


def test_in_bounds_constant_subscripts_pass():
    Program.parse("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{3}+A^{f64,g}_{0}"
                  "+W^{f64,g}_{a,2};];", SIG)


@pytest.mark.parametrize("text, tensor", [
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f32,g}_{a};];", "A"),   # signature tensor read with another dtype
    ("L^{4}_{a=0}[C^{f32,g}_{a}=A^{f64,g}_{a};];", "C"),   # signature tensor written with another dtype
    # an intermediate written with two dtypes
    ("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};X^{f32,g}_{a}=1;C^{f64,g}_{a}=X^{f64,g}_{a};];", "X"),
])
def test_dtype_mismatch(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("dtype-mismatch", tensor)


def test_reading_an_intermediate_with_another_dtype_or_scope_is_allowed():
    program = Program.parse("L^{4}_{a=0}[X^{f64,s}_{a}=A^{f64,g}_{a};];"
                            "L^{4}_{a=0}[C^{f64,g}_{a}=X^{f32,l}_{a};];", SIG)
    info = program.tensors["X"]
    assert (info.dtype, info.scope, info.role) == ("float64", "s", "intermediate")


def test_scope_mismatch():
    err = signature_error("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};X^{f64,s}_{a}=1;C^{f64,g}_{a}=X^{f64,g}_{a};];")
    assert (err.kind, err.tensor) == ("scope-mismatch", "X")


@pytest.mark.parametrize("text", [
    "L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{a,0};];",
    "L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};X^{f64,g}=1;C^{f64,g}_{a}=X^{f64,g}_{a};];",
])
def test_inconsistent_shape(text):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("inconsistent-shape", "X")


@pytest.mark.parametrize("text, tensor", [
    ("L^{4}_{a=0}[A^{f64,g}_{a}=1;C^{f64,g}_{a}=A^{f64,g}_{a};];", "A"),
    ("L^{4}_{a=0}L^{3}_{c=0}[W^{f64,g}_{a,c}=0;C^{f64,g}_{a}=1;];", "W"),
])
def test_writes_input(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("writes-input", tensor)


def test_output_not_written():
    err = signature_error("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];")
    assert (err.kind, err.tensor, err.nest) == ("output-not-written", "C", None)


@pytest.mark.parametrize("text, var", [
    ("L^{4}_{a=0}L^{4}_{a=0}[C^{f64,g}_{a}=1;];", "a"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=0;L^{3}_{a=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+1;];];", "a"),  # inner nest rebinds
    ("L^{4}_{a=0}[C^{f64,g}_{a}=0;]L^{3}_{a=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+1;];", "a"),   # trailing form
])
def test_duplicate_loop_var(text, var):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("duplicate-loop-var", var)


def test_sibling_nests_may_reuse_a_loop_var():
    Program.parse("L^{4}_{a=0}[C^{f64,g}_{a}=0;L^{3}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+1;];"
                  "L^{3}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}*2;];];", SIG)


@pytest.mark.parametrize("text, tensor", [
    # division by a non-constant cannot be bounded
    ("L^{4}_{a=0}L^{2}_{c=0}[X^{f64,g}_{a//c}=1;C^{f64,g}_{a}=1;];", "X"),
    # a float subscript
    ("L^{4}_{a=0}[X^{f64,g}_{a*1.5}=1;C^{f64,g}_{a}=1;];", "X"),
    # an index tensor whose values are data (unbounded)
    ("L^{4}_{c=0}[K^{i64,g}_{c}=A^{f64,g}_{c};];L^{4}_{c=0}[X^{f64,g}_{K^{i64,g}_{c}}=1;C^{f64,g}_{c}=1;];", "X"),
])
def test_unknown_shape(text, tensor):
    err = signature_error(text)
    assert (err.kind, err.tensor) == ("unknown-shape", tensor)


def test_every_signature_error_is_a_steptp_error():
    err = signature_error("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];")
    assert isinstance(err, StepTPError) and str(err).startswith("output-not-written:")


# -- bad signatures -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, tensor, fragment", [
    (lambda: TensorSpec("A", (4,), "float65"), "A", "unknown dtype"),
    (lambda: TensorSpec("A", (4,), "f64"), "A", "unknown dtype"),  # a LEIR code is not a dtype name
    (lambda: TensorSpec("A", (4,), "float64", "weight"), "A", "role"),
    (lambda: TensorSpec("A", (4, 0), "float64"), "A", "positive"),
    (lambda: TensorSpec("A", (-1,), "float64"), "A", "positive"),
    (lambda: TensorSpec("", (4,), "float64"), "", "identifier"),
    (lambda: TensorSpec("A b", (4,), "float64"), "A b", "identifier"),
    (lambda: Signature.of([spec("A", [4]), spec("A", [4], "output")]), "A", "twice"),
    (lambda: Signature.of([spec("A", [4]), spec("C", [4])]), None, "no output"),
    (lambda: Signature.of([]), None, "no output"),
    (lambda: Signature.of([{"name": "C", "dtype": "float64", "role": "output"}]), None, "malformed"),  # no shape
    (lambda: Signature.of([{"name": "C", "shape": 4, "dtype": "float64"}]), None, "malformed"),
    (lambda: Signature.of([{"name": "C", "shape": [1.5], "dtype": "float64"}]), None, "malformed"),
    (lambda: Signature.of([{"name": "C", "shape": "44", "dtype": "float64"}]), None, "malformed"),
    (lambda: Signature.of([{"name": "C", "shape": [True], "dtype": "float64"}]), None, "malformed"),
    (lambda: Signature.of([{"name": None, "shape": [4], "dtype": "float64"}]), None, "malformed"),
    (lambda: Signature.of([spec("C", [4], "output"), "D"]), None, "mapping"),
    (lambda: Signature.of([[1, 2]]), None, "mapping"),
    (lambda: Signature.of(None), None, "list of tensor specs"),
    (lambda: Signature.of('[{"name": "C", "shape": [4], "dtype": "float64", "role": "output"}'), None,
     "not valid JSON"),
    (lambda: Signature.of("not json at all"), None, "not valid JSON"),
    (lambda: Signature.of('{"name": "C", "shape": [4], "dtype": "float64", "role": "output"}'), None,
     "list of tensor specs"),
    (lambda: Signature.of("42"), None, "list of tensor specs"),
])
def test_bad_signature(make, tensor, fragment):
    with pytest.raises(SignatureError) as info:
        make()
    assert info.value.kind == "bad-signature"
    assert info.value.tensor == tensor
    assert fragment in str(info.value)


def test_program_parse_reports_a_bad_signature_before_looking_at_the_program():
    with pytest.raises(SignatureError) as info:
        Program.parse(COPY, "[]")
    assert info.value.kind == "bad-signature"


def test_signature_accepts_json_text_dicts_and_specs_alike():
    as_json = Signature.of(json.dumps(SIG))
    assert as_json == Signature.of(SIG) == Signature.of([TensorSpec.from_dict(s) for s in SIG])
    assert Signature.of(as_json) is as_json
    assert as_json.to_json() == SIG
    assert [t.name for t in as_json.inputs] == ["A", "W"] and [t.name for t in as_json.outputs] == ["C"]
    assert Program.parse(COPY, json.dumps(SIG)) == Program.parse(COPY, SIG)


# -- shape inference --------------------------------------------------------------------------------------

def test_shape_from_loop_extents():
    program = Program.parse("L^{4}_{a=0}L^{3}_{c=0}[X^{f32,l}_{c,a}=W^{f64,g}_{a,c};];"
                            "L^{4}_{a=0}[C^{f64,g}_{a}=X^{f32,l}_{0,a};];", SIG)
    x = program.intermediates["X"]
    assert (x.shape, x.dtype, x.scope, x.role) == ((3, 4), "float32", "l", "intermediate")


def test_shape_from_affine_subscripts():
    # c*2+d with c in [0,3] and d in [0,1] reaches 7; a+2 with a in [0,3] reaches 5
    program = Program.parse("L^{4}_{c=0}L^{2}_{d=0}[X^{f64,g}_{c*2+d}=A^{f64,g}_{c};];"
                            "L^{4}_{a=0}[Y^{f64,g}_{a+2}=A^{f64,g}_{a};];"
                            "L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{a*2}+Y^{f64,g}_{a+2};];", SIG)
    assert program.tensors["X"].shape == (8,)
    assert program.tensors["Y"].shape == (6,)


def test_shape_takes_the_largest_extent_over_all_writes():
    program = Program.parse("L^{4}_{a=0}[X^{f64,g}_{a}=A^{f64,g}_{a};];"
                            "L^{2}_{a=0}[X^{f64,g}_{a+5}=0;];"
                            "L^{4}_{a=0}[C^{f64,g}_{a}=X^{f64,g}_{a};];", SIG)
    assert program.tensors["X"].shape == (7,)


def test_shape_from_constant_subscripts():
    program = Program.parse("B^{4}_{tx=0}[D^{f64,g}_{0,tx}=A^{f64,g}_{tx};D^{f64,g}_{1,tx}=A^{f64,g}_{tx}*2;];"
                            "B^{4}_{tx=0}[C^{f64,g}_{tx}=D^{f64,g}_{1,tx}-D^{f64,g}_{0,tx};];", SIG)
    assert program.tensors["D"].shape == (2, 4)


def test_scalar_intermediate():
    program = Program.parse("L^{4}_{a=0}[S^{f64,g}=S^{f64,g}+A^{f64,g}_{a};];"
                            "L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a}/S^{f64,g};];", SIG)
    assert program.tensors["S"].shape == ()


def test_shape_through_an_index_tensor():
    # K holds c+1 for c in [0,3], so writing X at K_{c} reaches element 4: X has 5 elements
    text = ("L^{4}_{c=0}[K^{i64,g}_{c}=c+1;];"
            "L^{4}_{c=0}[X^{f64,g}_{K^{i64,g}_{c}}=A^{f64,g}_{c};];"
            "L^{4}_{c=0}[C^{f64,g}_{c}=X^{f64,g}_{c+1};];")
    program = Program.parse(text, SIG)
    assert program.tensors["K"].shape == (4,) and program.tensors["K"].dtype == "int64"
    assert program.tensors["X"].shape == (5,)
    assert set(program.intermediates) == {"K", "X"}


def test_index_tensor_range_covers_every_write():
    # K is written twice: values 1..4 and then 7 at K_{4}; X must reach 7
    text = ("L^{4}_{c=0}[K^{i64,g}_{c}=c+1;];B^{1}_{tx=0}[K^{i64,g}_{4}=7;];"
            "L^{5}_{c=0}[X^{f64,g}_{K^{i64,g}_{c}}=1;];"
            "L^{4}_{c=0}[C^{f64,g}_{c}=X^{f64,g}_{c};];")
    assert Program.parse(text, SIG).tensors["X"].shape == (8,)


def test_write_through_an_index_tensor_beyond_an_output():
    # K holds 1..4: C (4 elements) would be written at 4
    err = signature_error("L^{4}_{c=0}[K^{i64,g}_{c}=c+1;];L^{4}_{c=0}[C^{f64,g}_{K^{i64,g}_{c}}=1;];")
    assert (err.kind, err.tensor) == ("out-of-bounds", "C")


# -- parse errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, at, expected", [
    ("L^{4}_{a=0}[C^{f65,g}_{a}=1;];", "f65", "unknown dtype code 'f65'"),
    ("L^{4}_{a=0}[C^{f64,q}_{a}=1;];", "q}", "unknown storage scope 'q'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=foo(1);];", "foo(", "unknown function 'foo'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=max(1);];", "max(", "max takes 2 argument(s), got 1"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=exp(1,2);];", "exp(", "exp takes 1 argument(s), got 2"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=if_then_else(a<1,2);];", "if_then_else", "if_then_else takes 3"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1];", "];", "expected ';', found ']'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1;]", None, "expected ';' to end the nest"),
    ("L^{4}_{a=1}[C^{f64,g}_{a}=1;];", "1}[", "loops must start at 0"),
    ("L^{0}_{a=0}[C^{f64,g}_{a}=1;];", "0}_{a", "a loop extent must be positive"),
    ("L^{x}_{a=0}[C^{f64,g}_{a}=1;];", "x}_{a", "expected a loop extent"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1$;];", "$", "unexpected character '$'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a}@2;];", "@", "unexpected character '@'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=\u0663;];", "\u0663", "unexpected character"),  # a non-ASCII digit
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a}^2;];", "^2", "unexpected character '^'"),
    ("", None, "expected a loop nest, found end of input"),
    ("   ", None, "expected a loop nest, found end of input"),
    ("Q^{4}_{a=0}[C^{f64,g}=1;];", "Q^", "expected a loop"),
    ("L^{4}_{a=0}[];", "];", "expected an equation"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1;3];", "3]", "or ']', found '3'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=(1+2;];", ";]", "expected ')'"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1+;];", ";];", "expected an expression"),
    ("L^{4}_{a=0}[C^{f64,g}_{a,}=1;];", "}=1", "expected an expression"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64}_{a};];", "}_{a};", "expected ','"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1;];garbage", "garbage", "expected a loop"),
])
def test_parse_error_position_and_message(text, at, expected):
    with pytest.raises(ParseError) as info:
        parse_nests(text)
    err = info.value
    position = len(text) if at is None else text.index(at)
    assert err.position == position, f"{err} points at {text[err.position:err.position + 10]!r}"
    assert expected in err.message
    assert err.text == text and f"at character {position}" in str(err)


def test_parse_errors_come_before_signature_checks():
    with pytest.raises(ParseError):
        Program.parse("L^{4}_{a=0}[X^{f64,g}_{a}=1;]", SIG)  # also never writes C
