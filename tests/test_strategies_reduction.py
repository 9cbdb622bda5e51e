"""reduction_factorization's lane-wise form, `lanes=W`: the reduced loop split into an outer loop and W
vector lanes moved innermost, accumulating into a partial tensor with one element per lane, then a combine
nest folding the lanes into the target. (The split form is tested with the other memory strategies in
test_strategies_memory.py.)"""
from __future__ import annotations

import pytest

from steptp_env import Program, verify
from steptp_env.errors import IllegalActionError
from steptp_env.strategies import REGISTRY, Action, apply_action, canonical_text, identify
from steptp_env.workloads import get_workload

RF = REGISTRY["reduction_factorization"]


def _program(text: str, *specs: tuple[str, tuple[int, ...], str], dtype: str = "float32") -> Program:
    return Program.parse(text, [{"name": n, "shape": list(s), "dtype": dtype, "role": r} for n, s, r in specs])


ROW_MAX = _program("L^{64}_{a=0}L^{8192}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];",
                   ("A", (64, 8192), "input"), ("D", (64,), "output"))
ROW_SUM_EXP = _program("L^{16}_{a=0}L^{1024}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+exp(A^{f32,g}_{a,c}-C^{f32,g}_{a});];",
                       ("A", (16, 1024), "input"), ("C", (16,), "input"), ("D", (16,), "output"))
MATMUL = _program("L^{32}_{a=0}L^{32}_{c=0}L^{64}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}"
                  "*C^{f32,g}_{d,c};];",
                  ("A", (32, 64), "input"), ("C", (64, 32), "input"), ("D", (32, 32), "output"))
FULL_SUM = _program("L^{4}_{a=0}L^{256}_{c=0}[D^{f32,g}=D^{f32,g}+A^{f32,g}_{a,c};];",
                    ("A", (4, 256), "input"), ("D", (), "output"))
# a min reduction into a tensor an earlier nest wrote: the reduction ignores that value, and so must the
# combine (it is a reduction over the lanes, so it starts from the identity too)
UPDATED = _program("L^{3}_{a=0}[D^{f64,g}_{a}=A^{f64,g}_{a,0};];"
                   "L^{3}_{a=0}L^{32}_{c=0}[D^{f64,g}_{a}=min(D^{f64,g}_{a},A^{f64,g}_{a,c});];",
                   ("A", (3, 32), "input"), ("D", (3,), "output"), dtype="float64")

FORMS = [
    (ROW_MAX, "reduction_factorization(nest=0, loop=c, lanes=16)",
     "L^{64}_{a=0}L^{512}_{d=0}V^{16}_{c=0}[C^{f32,g}_{a,c}=max(C^{f32,g}_{a,c},A^{f32,g}_{a,d*16+c});];"
     "L^{64}_{a=0}L^{16}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},C^{f32,g}_{a,c});];"),
    (ROW_SUM_EXP, "reduction_factorization(nest=0, loop=c, lanes=16)",
     "L^{16}_{a=0}L^{64}_{d=0}V^{16}_{c=0}[E^{f32,g}_{a,c}=E^{f32,g}_{a,c}+exp(A^{f32,g}_{a,d*16+c}"
     "-C^{f32,g}_{a});];L^{16}_{a=0}L^{16}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+E^{f32,g}_{a,c};];"),
    (MATMUL, "reduction_factorization(nest=0, loop=d, lanes=16)",
     "L^{32}_{a=0}L^{32}_{c=0}L^{4}_{f=0}V^{16}_{d=0}[E^{f32,g}_{a,c,d}=E^{f32,g}_{a,c,d}+A^{f32,g}_{a,f*16+d}"
     "*C^{f32,g}_{f*16+d,c};];L^{32}_{a=0}L^{32}_{c=0}L^{16}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}"
     "+E^{f32,g}_{a,c,d};];"),
    (FULL_SUM, "reduction_factorization(nest=0, loop=c, lanes=8)",
     "L^{4}_{a=0}L^{32}_{d=0}V^{8}_{c=0}[C^{f32,g}_{c}=C^{f32,g}_{c}+A^{f32,g}_{a,d*8+c};];"
     "L^{8}_{c=0}[D^{f32,g}=D^{f32,g}+C^{f32,g}_{c};];"),
    (UPDATED, "reduction_factorization(nest=1, loop=c, lanes=4)",
     "L^{3}_{a=0}[D^{f64,g}_{a}=A^{f64,g}_{a,0};];"
     "L^{3}_{a=0}L^{8}_{d=0}V^{4}_{c=0}[C^{f64,g}_{a,c}=min(C^{f64,g}_{a,c},A^{f64,g}_{a,d*4+c});];"
     "L^{3}_{a=0}L^{4}_{c=0}[D^{f64,g}_{a}=min(D^{f64,g}_{a},C^{f64,g}_{a,c});];"),
]


@pytest.mark.parametrize("before,text,expected", FORMS, ids=["max", "sum_exp", "matmul_k", "scalar", "updated"])
def test_lanes_form_text_and_equivalence(before, text, expected):
    action = Action.parse(text)
    after = apply_action(before, action)
    assert after.leir == expected
    report = verify(after, before, trials=1)
    assert report.equivalent, report.reason
    explanation = RF.explain(before, action, after)
    assert f"{action['lanes']} lanes" in explanation and "Legal because" in explanation
    # infer recovers the action from the pair, and identify recognises it up to fresh names
    assert action in RF.infer(before, after)
    assert action in identify(before, after, ["reduction_factorization"])
    assert Action.parse(action.text) == action


def test_the_briefs_spelling_is_the_same_program():
    """The form as first written down, with other fresh names (partial P, outer loop f)."""
    after = apply_action(ROW_MAX, "reduction_factorization(nest=0, loop=c, lanes=16)")
    spelled = Program.parse("L^{64}_{a=0}L^{512}_{f=0}V^{16}_{c=0}[P^{f32,g}_{a,c}=max(P^{f32,g}_{a,c},"
                            "A^{f32,g}_{a,f*16+c});];L^{64}_{a=0}L^{16}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},"
                            "P^{f32,g}_{a,c});];", ROW_MAX.signature)
    assert canonical_text(after) == canonical_text(spelled)
    assert identify(ROW_MAX, spelled, ["reduction_factorization"]) == \
        [Action.parse("reduction_factorization(nest=0, loop=c, lanes=16)")]


SCAN = _program("L^{4}_{a=0}L^{6}_{c=0}L^{8}_{d=0}[E^{f32,g}_{a,c}=E^{f32,g}_{a,c}+if_then_else(c-1<0,0,"
                "E^{f32,g}_{a,c-1})+A^{f32,g}_{a,c,d};];L^{4}_{a=0}L^{6}_{c=0}[D^{f32,g}_{a,c}=E^{f32,g}_{a,c};];",
                ("A", (4, 6, 8), "input"), ("D", (4, 6), "output"))
VECTORIZED = _program("L^{4}_{a=0}L^{64}_{c=0}V^{4}_{d=0}[D^{f32,g}_{a,d}=D^{f32,g}_{a,d}+A^{f32,g}_{a,c*4+d};];",
                      ("A", (4, 256), "input"), ("D", (4, 4), "output"))
# the reduction reads its own target at another element: the order of c's iterations matters
SELF_READ = _program("L^{4}_{a=0}[E^{f32,g}_{a}=A^{f32,g}_{a,0};];"
                     "L^{4}_{a=0}L^{16}_{c=0}[E^{f32,g}_{a}=E^{f32,g}_{a}+E^{f32,g}_{0}*A^{f32,g}_{a,c};];"
                     "L^{4}_{a=0}[D^{f32,g}_{a}=E^{f32,g}_{a};];",
                     ("A", (4, 16), "input"), ("D", (4,), "output"))

ILLEGAL = [
    (ROW_SUM_EXP, "reduction_factorization(nest=0, loop=c, lanes=12)", "lanes must be one of 4, 8, 16, 32, 64"),
    (ROW_SUM_EXP, "reduction_factorization(nest=0, loop=c, lanes=2)", "lanes must be one of"),
    (ROW_SUM_EXP, "reduction_factorization(nest=0, loop=c, lanes=x)", "lanes must be one of"),
    (FULL_SUM, "reduction_factorization(nest=0, loop=a, lanes=4)", "must divide the extent 4 .* smaller"),
    (_program("L^{4}_{a=0}L^{24}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c};];",
              ("A", (4, 24), "input"), ("D", (4,), "output")),
     "reduction_factorization(nest=0, loop=c, lanes=16)", "must divide the extent 24"),
    (MATMUL, "reduction_factorization(nest=0, loop=c, lanes=16)", "loop c is not reduced"),
    (SCAN, "reduction_factorization(nest=0, loop=d, lanes=4)", "prefix scan"),
    (SCAN, "reduction_factorization(nest=1, loop=c, lanes=4)", "not a single reduction"),
    (VECTORIZED, "reduction_factorization(nest=0, loop=c, lanes=16)", "already has the vectorized loop"),
    (SELF_READ, "reduction_factorization(nest=1, loop=c, lanes=8)", "cannot be reordered into lanes"),
    (ROW_MAX, "reduction_factorization(nest=0, loop=c, lanes=16, split=8)", "takes parameters"),
    (ROW_MAX, "reduction_factorization(nest=3, loop=c, lanes=16)", "no nest 3"),
    (ROW_MAX, "reduction_factorization(nest=0, loop=z, lanes=16)", "no loop 'z'"),
]


@pytest.mark.parametrize("program,text,reason", ILLEGAL, ids=[t for _, t, _ in ILLEGAL])
def test_illegal_lanes_actions_are_refused_with_a_reason(program, text, reason):
    with pytest.raises(IllegalActionError, match=reason):
        apply_action(program, text)
    assert Action.parse(text) not in RF.candidates(program, "llvm")


def test_softmax_menu_offers_lanes_after_the_splits_on_llvm_only():
    workload = get_workload("level1/softmax", "tiny")
    program = workload.program
    menu = [a.text for a in RF.candidates(program, "llvm")]
    expected = []
    for n in (0, 1):  # the row max and the row sum of exp; loop c has 1024 iterations
        expected += [f"reduction_factorization(nest={n}, loop=c, split={s})" for s in (512, 768)]
        expected += [f"reduction_factorization(nest={n}, loop=c, lanes={w})" for w in (16, 8)]
    assert menu == expected
    assert [a.text for a in RF.candidates(program, "cuda")] == [t for t in expected if "split" in t]
    for text in menu:
        if "lanes" not in text:
            continue
        action = Action.parse(text)
        after = RF.apply(program, action)
        assert after.nests[action["nest"]].loops[-1].kind == "V"
        report = verify(after, workload, trials=1)
        assert report.equivalent, (text, report.reason)
        assert action in RF.infer(program, after)


def test_no_lanes_for_loops_too_short_or_indivisible():
    short = _program("L^{4}_{a=0}L^{16}_{c=0}L^{6}_{d=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c,d};];",
                     ("A", (4, 16, 6), "input"), ("D", (4,), "output"))
    lanes = [a.text for a in RF.candidates(short) if a.get("lanes") is not None]
    assert lanes == ["reduction_factorization(nest=0, loop=c, lanes=8)"]  # 16 is not smaller; 6 has none
    assert not [a for a in RF.candidates(VECTORIZED) if a.get("lanes") is not None]
