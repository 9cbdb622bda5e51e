"""Fuzzing the LEIR front end with mutated reference programs.

Whatever the text, `Program.parse` may only fail with a `ParseError` that points inside the text or a
`SignatureError` that names the tensor (or loop variable) concerned; anything else (IndexError, KeyError,
RecursionError, TypeError, ...) is a bug. Texts that do parse must print to a text that parses back to
the same program.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from steptp_env.errors import ParseError, SignatureError
from steptp_env.ir import Program, Signature, parse_nests, print_nests
from steptp_env.ir.ast import BINARY_OPS, COMPARE_OPS, FUNCTIONS, LOOP_KINDS, SCOPES
from steptp_env.ir.dtypes import CODE_TO_DTYPE
from steptp_env.ir.parser import MAX_DEPTH

REF = Path(__file__).resolve().parents[1].parent / "shared" / "steptp-ref"
PROGRAMS_FILE = REF / "programs.jsonl"


def _load_programs() -> list[dict]:
    if not PROGRAMS_FILE.is_file():
        return []
    with open(PROGRAMS_FILE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


PROGRAMS = _load_programs()
needs_corpus = pytest.mark.skipif(not PROGRAMS, reason=f"reference programs not found at {PROGRAMS_FILE} "
                                  "(the Step-TP reference corpus, expected next to the repository)")

SIGNATURE_KINDS = {"undefined-name", "rank-mismatch", "read-before-write", "out-of-bounds", "dtype-mismatch",
                   "scope-mismatch", "inconsistent-shape", "writes-input", "output-not-written",
                   "duplicate-loop-var", "unknown-shape"}

# Pieces to insert: single characters LEIR uses (and a few it does not), its multi-character operators, and
# fragments that make structurally plausible programs (loops, accesses, calls, odd numbers).
PIECES = (list("ACDEFKXZabcdftx0123456789^_{}[]()=;,.+-*/%<>&!e $") +
          ["**", "//", "<=", ">=", "==", "!=", "^{", "_{", "f64", "f32", "i64", "bool", "f65", "g", "s", "q",
           "inf", "-inf", "exp(", "max(", "min(", "if_then_else(", "foo(", "L^{4}_{a=0}", "B^{2}_{tx=0}",
           "L^{0}_{a=0}", "L^{3}_{d=1}", "A^{f64,g}_{a}", "K^{i64,g}_{c}", "A^{f64,g}", "-1", "0",
           "99999999999999999999", "1e-05", "1.", "((", "))", "];", "[", ";];"])

# A tokenizer that never fails, so token-level mutations work on already mutated text too.
TOKEN = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[A-Za-z][A-Za-z0-9_]*"
                   r"|\*\*|//|<=|>=|==|!=|\^\{|_\{|.", re.DOTALL)

OPERATIONS = ("delete", "insert", "replace", "truncate", "duplicate", "swap_tokens", "copy_token",
              "drop_token", "replace_token", "same_kind")


def _kind(token: str) -> str:
    """A class of interchangeable tokens: swapping two of a class keeps the text close to well formed."""
    if token[0].isdigit():
        return "number"
    if token in CODE_TO_DTYPE:
        return "dtype"
    if token in SCOPES:
        return "scope"
    if token in FUNCTIONS:
        return f"function/{FUNCTIONS[token]}"
    if token in LOOP_KINDS:
        return "loop kind"
    if token[0].isalpha():
        return "tensor" if token[0].isupper() else "loop var"
    if token in BINARY_OPS:
        return "binary op"
    if token in COMPARE_OPS:
        return "comparison"
    return token  # punctuation only matches itself


def _mutate(data, text: str, operations: tuple[str, ...] = OPERATIONS) -> str:
    op = data.draw(st.sampled_from(operations), label="operation")
    n = len(text)
    if op in ("delete", "insert", "replace", "truncate", "duplicate"):
        i = data.draw(st.integers(0, n), label="at")
        j = min(n, i + data.draw(st.integers(0, 12), label="length"))
        if op == "delete":
            return text[:i] + text[j:]
        if op == "insert":
            return text[:i] + data.draw(st.sampled_from(PIECES), label="piece") + text[i:]
        if op == "replace":
            return text[:i] + data.draw(st.sampled_from(PIECES), label="piece") + text[j:]
        if op == "truncate":
            return text[:i]
        k = min(n, i + data.draw(st.integers(1, 60), label="slice"))
        return text[:k] + text[i:k] + text[k:]  # duplicate text[i:k] right after itself
    tokens = TOKEN.findall(text)
    if not tokens:
        return text
    i = data.draw(st.integers(0, len(tokens) - 1), label="token")
    if op == "swap_tokens":
        j = data.draw(st.integers(0, len(tokens) - 1), label="other token")
        tokens[i], tokens[j] = tokens[j], tokens[i]
    elif op == "copy_token":  # a token replaced by another token of the same program (names, numbers, ops)
        tokens[i] = tokens[data.draw(st.integers(0, len(tokens) - 1), label="source token")]
    elif op == "same_kind":  # a name, number or operator replaced by another of the program's: keeps syntax
        kind = _kind(tokens[i])
        pool = sorted({t for t in tokens if _kind(t) == kind} | {p for p in PIECES if _kind(p) == kind})
        tokens[i] = data.draw(st.sampled_from(pool), label="same-kind token")
    elif op == "drop_token":
        del tokens[i]
    else:
        tokens[i] = data.draw(st.sampled_from(PIECES), label="piece")
    return "".join(tokens)


def _check_parse_error(err: ParseError, text: str) -> None:
    assert isinstance(err.position, int) and 0 <= err.position <= len(text), (err.position, len(text), text)
    assert isinstance(err.message, str) and err.message
    assert f"at character {err.position}" in str(err)


def _check_signature_error(err: SignatureError, text: str, signature: Signature) -> None:
    assert err.kind in SIGNATURE_KINDS, err
    assert isinstance(err.tensor, str) and err.tensor, err
    if err.kind == "output-not-written":
        assert err.tensor in signature and err.nest is None, err
    else:
        assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(err.tensor)}(?![A-Za-z0-9_])", text), (err, text)
        assert isinstance(err.nest, int) and 0 <= err.nest < len(parse_nests(text)), err


def _parse_and_check(text: str, signature: Signature) -> None:
    """The oracle: only well-formed StepTP errors, and valid programs round-trip through the printer."""
    try:
        program = Program.parse(text, signature)
    except ParseError as err:
        event("ParseError")
        _check_parse_error(err, text)
        return
    except SignatureError as err:
        event(f"SignatureError {err.kind}")
        _check_signature_error(err, text, signature)
        return
    event("valid")
    again = Program.parse(program.leir, signature)
    assert again.nests == program.nests
    assert again.leir == program.leir
    for name, info in program.intermediates.items():
        assert all(d >= 1 for d in info.shape), (name, info)


FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


@needs_corpus
@settings(FUZZ, max_examples=2500)
@given(data=st.data())
def test_mutated_reference_programs_fail_only_with_steptp_errors(data):
    """Character and token edits of every kind: mostly parse errors, some programs that still parse."""
    row = data.draw(st.sampled_from(PROGRAMS), label="program")
    text = row["leir"]
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        text = _mutate(data, text)
    _parse_and_check(text, Signature.of(row["signature"]))


@needs_corpus
@settings(FUZZ, max_examples=2000)
@given(data=st.data())
def test_token_class_mutations_reach_the_signature_checks(data):
    """Names, numbers, dtype codes, scopes and operators swapped within their class: the text stays close to
    well formed, so the signature checks and shape inference see unusual programs."""
    row = data.draw(st.sampled_from(PROGRAMS), label="program")
    text = row["leir"]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        text = _mutate(data, text, ("same_kind",))
    _parse_and_check(text, Signature.of(row["signature"]))


@settings(FUZZ, max_examples=400)
@given(text=st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_random_piece_soup_fails_only_with_parse_errors(text):
    """Short texts built from scratch: no signature checks, just the parser and printer."""
    try:
        nests = parse_nests(text)
    except ParseError as err:
        _check_parse_error(err, text)
        return
    assert parse_nests(print_nests(nests)) == nests


# -- nesting depth ------------------------------------------------------------------------------------------

SIG = [{"name": "A", "shape": [4], "dtype": "float64", "role": "input"},
       {"name": "C", "shape": [4], "dtype": "float64", "role": "output"}]
SCALAR_SIG = [{"name": "A", "shape": [4], "dtype": "float64", "role": "input"},
              {"name": "S", "shape": [], "dtype": "float64", "role": "output"}]


def _in_nest(rhs: str) -> str:
    return "L^{4}_{a=0}[C^{f64,g}_{a}=" + rhs + ";];"


def _nested_loops(depth: int) -> str:
    loops = "".join(f"L^{{1}}_{{v{k}=0}}[" for k in range(depth))
    return "L^{4}_{a=0}[" + loops + "S^{f64,g}=1;" + "];" * depth + "];"


# name -> (text nesting `depth` levels, the signature, a pattern matching every token that opens a level)
NESTINGS = {
    "parentheses": (lambda d: _in_nest("(" * d + "a" + ")" * d), SIG, r"\("),
    "unclosed parentheses": (lambda d: _in_nest("(" * d), SIG, r"\("),
    "unary minus": (lambda d: _in_nest("-" * d + "a"), SIG, "-"),
    "minus and parentheses": (lambda d: _in_nest("-(" * (d // 2) + "a" + ")" * (d // 2)), SIG, r"-|\("),
    "power": (lambda d: _in_nest("a**" * d + "a"), SIG, r"\*\*"),
    "calls": (lambda d: _in_nest("exp(" * d + "a" + ")" * d), SIG, r"exp\("),
    "subscripts": (lambda d: _in_nest("A^{f64,g}_{" * d + "a" + "}" * d), SIG, r"(?<=A\^\{f64,g\})_\{"),
    "inner nests": (_nested_loops, SCALAR_SIG, r"L\^\{1\}"),
}


@pytest.mark.parametrize("name", NESTINGS)
def test_ten_thousand_levels_give_a_parse_error_not_a_recursion_error(name):
    build, signature, _ = NESTINGS[name]
    text = build(10_000)
    with pytest.raises(ParseError) as info:
        Program.parse(text, signature)
    assert "nested too deeply" in info.value.message
    _check_parse_error(info.value, text)


@pytest.mark.parametrize("name", NESTINGS)
def test_the_opener_one_level_too_deep_is_reported(name):
    build, _, opener = NESTINGS[name]
    text = build(MAX_DEPTH + 2)
    with pytest.raises(ParseError) as info:
        parse_nests(text)
    openers = [m.start() for m in re.finditer(opener, text)]
    assert info.value.position == openers[MAX_DEPTH], (name, info.value)


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _call_at_stack_depth(depth: int, fn):
    """Call `fn` once the stack is `depth` frames deep (a caller that is itself deeply recursive)."""
    if _stack_depth() >= depth:
        return fn()
    return _call_at_stack_depth(depth, fn)


@pytest.mark.parametrize("name", [n for n in NESTINGS if n != "unclosed parentheses"])
def test_max_depth_is_accepted_and_round_trips_even_from_a_deep_caller(name):
    build, signature, _ = NESTINGS[name]
    text = build(MAX_DEPTH)
    # parsing, checking and printing at the limit must fit in 600 frames under a caller using the rest
    program = _call_at_stack_depth(sys.getrecursionlimit() - 600,
                                   lambda: (lambda p: (p, p.leir))(Program.parse(text, signature)))[0]
    assert program.leir == text
    assert Program.parse(program.leir, signature).nests == program.nests
