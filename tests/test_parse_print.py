"""LEIR parsing and printing: the reference corpus round-trips exactly, and the printer's parentheses are
the minimum the precedence rules need (plus the redundant ones the source had)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from steptp_env.ir import Program, parse_expr, print_expr
from steptp_env.ir.ast import Access, And, BinOp, Call, Compare, Const, Neg, Var

REF = Path(__file__).resolve().parents[1].parent / "shared" / "steptp-ref"


def _reference_texts() -> dict[str, list]:
    """Every distinct LEIR text of the reference corpus, each with the signature of its program."""
    if not (REF / "programs.jsonl").is_file() or not (REF / "transitions.jsonl.gz").is_file():
        pytest.skip(f"reference corpus not found at {REF} (expected programs.jsonl and transitions.jsonl.gz)")
    signatures: dict[str, list] = {}
    texts: dict[str, list] = {}
    with open(REF / "programs.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            signatures[row["id"]] = row["signature"]
            texts[row["leir"]] = row["signature"]
    with gzip.open(REF / "transitions.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            for key in ("original_leir", "transformed_leir"):
                texts.setdefault(row[key], signatures[row["program"]])
    return texts


def test_reference_corpus_round_trips_exactly():
    texts = _reference_texts()
    assert len(texts) > 8000  # 202 programs and both sides of 9,004 transitions, deduplicated
    failures = []
    for text, signature in texts.items():
        try:
            leir = Program.parse(text, signature).leir
        except Exception as exc:  # collect everything, report a few
            failures.append(f"{type(exc).__name__}: {exc} -- {text[:200]}")
            continue
        if leir != text:
            failures.append(f"printed differently:\n  in : {text[:300]}\n  out: {leir[:300]}")
    assert not failures, f"{len(failures)} of {len(texts)} texts failed; first ones:\n" + "\n".join(failures[:5])


# -- round trips of expressions as written ------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "-a*b", "-(a*b)", "(a+b)*c", "a-(b-c)", "a-b-c", "a/(b*c)", "a/b*c", "a//(b%c)",
    "x**2", "(-x)**2", "-x**2", "x**(1/2)", "x**y**z", "(x**y)**z", "x**-y", "a--b", "-(-a)",
    "2<=c<258&1<=d<257", "tx!=-100", "(a<b)<c", "a<(b<c)", "a&(b&c)", "(a&b)&c", "(a+b<c)&d",
    "1e-05", "1.0e-5", "0.7978845608028654", "1.", "-inf", "inf", "007",
    "(c+512)+f", "((a))", "exp(-(x))", "max(a,b)+min(-a,if_then_else(a<b,a,b))",
    "A^{f64,g}_{tx,a,c*2+d*3}", "E^{i64,s}_{(1-c)+f}", "R^{f32,l}", "C^{bool,g}_{tx//4,tx%4}",
])
def test_expression_text_round_trips(text):
    assert print_expr(parse_expr(text)) == text


@pytest.mark.parametrize("text, tree", [
    ("-a*b", BinOp("*", Neg(Var("a")), Var("b"))),
    ("-(a*b)", Neg(BinOp("*", Var("a"), Var("b")))),
    ("(a+b)*c", BinOp("*", BinOp("+", Var("a"), Var("b")), Var("c"))),
    ("a-b-c", BinOp("-", BinOp("-", Var("a"), Var("b")), Var("c"))),
    ("a-(b-c)", BinOp("-", Var("a"), BinOp("-", Var("b"), Var("c")))),
    ("a/(b*c)", BinOp("/", Var("a"), BinOp("*", Var("b"), Var("c")))),
    ("-x**2", Neg(BinOp("**", Var("x"), Const(2)))),
    ("(-x)**2", BinOp("**", Neg(Var("x")), Const(2))),
    ("x**y**z", BinOp("**", Var("x"), BinOp("**", Var("y"), Var("z")))),
    ("x**(1/2)", BinOp("**", Var("x"), BinOp("/", Const(1), Const(2)))),
    ("2<=c<258&1<=d<257", And(Compare((Const(2), Var("c"), Const(258)), ("<=", "<")),
                             Compare((Const(1), Var("d"), Const(257)), ("<=", "<")))),
    ("tx!=-100", Compare((Var("tx"), Neg(Const(100))), ("!=",))),
    ("a&b&c", And(And(Var("a"), Var("b")), Var("c"))),
])
def test_parse_gives_the_expected_tree(text, tree):
    assert parse_expr(text) == tree


@pytest.mark.parametrize("text, value, is_int", [
    ("1e-05", 1e-05, False), ("1.0e-5", 1e-05, False), ("0.7978845608028654", 0.7978845608028654, False),
    ("16", 16, True), ("2.0", 2.0, False), ("1.", 1.0, False), ("inf", float("inf"), False),
])
def test_numbers_keep_their_spelling(text, value, is_int):
    node = parse_expr(text)
    assert isinstance(node, Const) and node.value == value and node.is_int == is_int
    assert node.text == text and print_expr(node) == text


def test_number_spelling_does_not_take_part_in_equality():
    assert parse_expr("1e-05") == parse_expr("1.0e-5")
    assert print_expr(parse_expr("1e-05")) != print_expr(parse_expr("1.0e-5"))


# -- programmatically built trees: minimal parentheses --------------------------------------------------

a, b, c, x, y = (Var(n) for n in "abcxy")


@pytest.mark.parametrize("tree, text", [
    (BinOp("-", a, BinOp("-", b, c)), "a-(b-c)"),
    (BinOp("-", BinOp("-", a, b), c), "a-b-c"),
    (BinOp("+", a, BinOp("+", b, c)), "a+(b+c)"),  # kept: the tree is right-nested
    (BinOp("+", a, BinOp("*", b, c)), "a+b*c"),
    (BinOp("*", BinOp("+", a, b), c), "(a+b)*c"),
    (BinOp("/", a, BinOp("*", b, c)), "a/(b*c)"),
    (BinOp("*", BinOp("/", a, b), c), "a/b*c"),
    (BinOp("%", a, BinOp("//", b, c)), "a%(b//c)"),
    (Neg(BinOp("*", a, b)), "-(a*b)"),
    (BinOp("*", Neg(a), b), "-a*b"),
    (Neg(BinOp("+", a, b)), "-(a+b)"),
    (Neg(Neg(a)), "--a"),
    (BinOp("-", a, Neg(b)), "a--b"),
    (BinOp("**", x, Const(2)), "x**2"),
    (BinOp("**", Neg(x), Const(2)), "(-x)**2"),
    (Neg(BinOp("**", x, Const(2))), "-x**2"),
    (BinOp("**", x, BinOp("/", Const(1), Const(2))), "x**(1/2)"),
    (BinOp("**", x, Neg(y)), "x**-y"),
    (BinOp("**", BinOp("**", x, y), c), "(x**y)**c"),
    (BinOp("**", x, BinOp("**", y, c)), "x**y**c"),
    (BinOp("**", BinOp("*", a, b), c), "(a*b)**c"),
    (Compare((Const(2), c, Const(258)), ("<=", "<")), "2<=c<258"),
    (Compare((Compare((a, b), ("<",)), c), ("==",)), "(a<b)==c"),
    (Compare((BinOp("+", a, b), c), ("<",)), "a+b<c"),
    (Compare((x, Neg(Const(100))), ("!=",)), "x!=-100"),
    (And(Compare((a, b), ("<",)), Compare((c, x), (">=",))), "a<b&c>=x"),
    (And(a, And(b, c)), "a&(b&c)"),
    (And(And(a, b), c), "a&b&c"),
    (Compare((And(a, b), c), ("<",)), "(a&b)<c"),
    (Call("max", (BinOp("+", a, b), Neg(c))), "max(a+b,-c)"),
    (BinOp("*", Call("exp", (Neg(x),)), Const(0.5)), "exp(-x)*0.5"),
    (Access("A", "float64", "g", (BinOp("+", BinOp("*", c, Const(2)), a), Var("tx"))),
     "A^{f64,g}_{c*2+a,tx}"),
    (Access("K", "int64", "s", ()), "K^{i64,s}"),
    (BinOp("-", Const(1.0), Const(float("inf"))), "1.0-inf"),
])
def test_built_trees_print_minimally_and_reparse_equal(tree, text):
    assert print_expr(tree) == text
    assert parse_expr(text) == tree


def test_redundant_parentheses_are_kept_but_do_not_change_equality():
    written = parse_expr("(c+512)+f")
    assert written == parse_expr("c+512+f")
    assert hash(written) == hash(parse_expr("c+512+f"))
    assert print_expr(written) == "(c+512)+f"
    assert parse_expr("((a))*(b)") == BinOp("*", a, b)
    assert print_expr(parse_expr("((a))*(b)")) == "((a))*(b)"
    assert parse_expr("(a-b)-c") == parse_expr("a-b-c")


def test_structural_equality_still_sees_real_differences():
    assert parse_expr("a-(b-c)") != parse_expr("a-b-c")
    assert parse_expr("-x**2") != parse_expr("(-x)**2")
    assert parse_expr("A^{f64,g}_{a}") != parse_expr("A^{f32,g}_{a}")
    assert parse_expr("A^{f64,g}_{a}") != parse_expr("A^{f64,s}_{a}")


def test_program_round_trip_with_inner_and_trailing_nests():
    sig = [{"name": "A", "shape": [2, 3], "dtype": "float64", "role": "input"},
           {"name": "D", "shape": [2], "dtype": "float64", "role": "output"}]
    trailing = "L^{2}_{c=0}[D^{f64,g}_{c}=0;]L^{3}_{d=0}[D^{f64,g}_{c}=D^{f64,g}_{c}+A^{f64,g}_{c,d};];"
    inner = "L^{2}_{c=0}[D^{f64,g}_{c}=0;L^{3}_{d=0}[D^{f64,g}_{c}=D^{f64,g}_{c}+A^{f64,g}_{c,d};];];"
    p_trailing, p_inner = Program.parse(trailing, sig), Program.parse(inner, sig)
    assert p_trailing.leir == trailing and p_inner.leir == inner
    assert p_trailing.nests == p_inner.nests  # the trailing form is only a spelling


# -- the grammar document -----------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "leir.md"


def test_docs_examples_parse_and_print_back_exactly():
    import re

    from steptp_env.ir import parse_nests, print_nests

    text = DOC.read_text(encoding="utf-8")
    assert "<!-- GRAMMAR" not in text
    blocks = re.findall(r"```leir\n(.*?)```", text, re.DOTALL)
    programs = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(programs) >= 6
    for program in programs:
        assert print_nests(parse_nests(program)) == program


def test_docs_grammar_lists_every_dtype_code_function_and_the_depth_limit():
    import re

    from steptp_env.ir.ast import FUNCTIONS, LOOP_KINDS, SCOPES
    from steptp_env.ir.dtypes import CODE_TO_DTYPE
    from steptp_env.ir.parser import MAX_DEPTH

    text = DOC.read_text(encoding="utf-8")
    ebnf = re.search(r"```ebnf\n(.*?)```", text, re.DOTALL).group(1)
    for words in (CODE_TO_DTYPE, FUNCTIONS, SCOPES, LOOP_KINDS):
        for word in words:
            assert f'"{word}"' in ebnf, word
    for code, dtype in CODE_TO_DTYPE.items():
        assert f"| `{code}` | {dtype} |" in text, code
    assert f"at most {MAX_DEPTH} levels" in text
