"""Padded inputs: `layout_transformation` with a `[k,pad,P]` group, and the sum reductions it lets run to P.

The padded copy and the extended loop are checked against PyTorch (built with TVM, fresh random inputs),
against the unpadded program on inputs holding inf and NaN (their positions must not move), and the rules
that refuse an extension (a body that does not vanish, an unpadded partner, a factor that could be inf) are
checked one by one.
"""
from __future__ import annotations

import numpy as np
import pytest

from steptp_env import Program, verify
from steptp_env.errors import IllegalActionError
from steptp_env.measure.build import build
from steptp_env.strategies import Action, apply_action, get_strategy
from steptp_env.strategies.padding import pad_extent
from steptp_env.workloads import get_workload

LAYOUT = get_strategy("layout_transformation")
PAD_A = "layout_transformation(nest=0, tensor=A, layout=[0,[1,pad,40]])"
PAD_C = "layout_transformation(nest=1, tensor=C, layout=[[0,pad,40],1])"


@pytest.fixture(scope="module")
def matmul():
    """A 29x37 @ 37x41 GEMM: a reduction of extent 37, which nothing divides."""
    return get_workload("level1/matmul_irregular", preset="tiny")


def _program(text: str, *specs: tuple[str, tuple[int, ...], str]) -> Program:
    return Program.parse(text, [{"name": n, "shape": list(s), "dtype": "float32", "role": r} for n, s, r in specs])


def _reduction_extent(program: Program) -> int:
    return program.nests[-1].loops[-1].extent


def test_pad_extent_rule():
    assert [pad_extent(n) for n in (37, 197, 62, 22, 40, 64, 11, 8)] == [40, 208, 64, 24, 48, None, None, None]


def test_menu_lists_pads_of_reduced_dimensions_after_the_other_layouts(matmul):
    program = matmul.program
    texts = [a.text for a in LAYOUT.candidates(program)]
    assert texts[-2:] == [PAD_A, PAD_C.replace("nest=1", "nest=0")]
    assert all("pad" not in t for t in texts[:-2])
    # the output dimensions (a, c) are never padded; a padded copy is not offered a second pad
    after = apply_action(program, PAD_A)
    assert [a.text for a in LAYOUT.candidates(after) if "pad" in a.text] == [PAD_C]


def test_pad_menu_does_not_depend_on_what_was_enumerated_before():
    """The same reading nest is offered a pad when its input is a plain copy and none when it is a padded
    one, whichever program was enumerated first (the per-nest candidate cache keys on the padding)."""
    plain = _program("L^{4}_{a=0}L^{40}_{c=0}[E^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];"
                     "L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+E^{f32,g}_{a,c};];",
                     ("A", (4, 40), "input"), ("D", (4,), "output"))
    padded = _program("L^{4}_{a=0}L^{40}_{c=0}[E^{f32,g}_{a,c}=if_then_else(c<37,A^{f32,g}_{a,c},0);];"
                      "L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+E^{f32,g}_{a,c};];",
                      ("A", (4, 40), "input"), ("D", (4,), "output"))
    for first, second in ((plain, padded), (padded, plain)):
        pads = [[a.text for a in LAYOUT.candidates(p) if "pad" in a.text] for p in (first, second)]
        assert pads == ([["layout_transformation(nest=1, tensor=E, layout=[0,[1,pad,40]])"], []]
                        if first is plain else [[], ["layout_transformation(nest=1, tensor=E, layout=[0,[1,pad,40]])"]])


def test_second_pad_extends_the_reduction_and_verifies(matmul):
    one = apply_action(matmul.program, PAD_A)
    assert "if_then_else(d<37,A^{f32,g}_{a,d},0)" in one.leir and _reduction_extent(one) == 37
    assert one.tensors["E"].shape == (29, 40)
    two = apply_action(one, PAD_C)
    assert _reduction_extent(two) == 40 and two.tensors["F"].shape == (40, 41)
    assert "loop d from 37 to 40" in LAYOUT.explain(one, Action.parse(PAD_C), two)
    for program in (one, two):
        report = verify(program, matmul, trials=2)
        assert report.equivalent, report.reason
    # the new extent has the factors the loop menus offer: split by 8 and vectorise
    split = apply_action(two, "loop_split(nest=2, loop=d, factor=8)")
    assert verify(split, matmul, trials=1).equivalent


def test_padding_keeps_inf_and_nan_positions(matmul):
    padded = apply_action(apply_action(matmul.program, PAD_A), PAD_C)
    rng = np.random.default_rng(0)
    inputs = {"A": rng.uniform(-1, 1, (29, 37)).astype(np.float32),
              "C": rng.uniform(-1, 1, (37, 41)).astype(np.float32)}
    inputs["A"][3, 36] = np.inf
    inputs["A"][5, 0] = np.nan
    inputs["C"][36, 7] = -np.inf
    expected = build(matmul.program)(inputs)["D"]
    actual = build(padded)(inputs)["D"]
    assert np.array_equal(np.isnan(actual), np.isnan(expected)) and np.isnan(expected).any()
    assert np.array_equal(np.isinf(actual), np.isinf(expected)) and np.isinf(expected).any()
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, reason", [
    # (x - m) * (x - m) is m*m, not 0, at a padded x
    ("L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+(A^{f32,g}_{a,c}-C^{f32,g}_{a})*(A^{f32,g}_{a,c}"
     "-C^{f32,g}_{a});];", "body"),
    # 0 * C could be NaN when C is inf
    ("L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c}*C^{f32,g}_{a};];", "factor"),
    # a max reduction: a zero is not its identity
    ("L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];", "max"),
])
def test_extension_refused_where_the_added_terms_could_change_a_value(text, reason):
    program = _program(text, ("A", (4, 37), "input"), ("C", (4,), "input"), ("D", (4,), "output"))
    after = apply_action(program, "layout_transformation(nest=0, tensor=A, layout=[0,[1,pad,40]])")
    assert after.nests[1].loops[1].extent == 37, reason
    report = verify(after, program, trials=1)
    assert report.equivalent, report.reason


def test_sum_of_a_padded_tensor_extends_at_once():
    """One padded read is all a plain sum (or a sum of squares, or a scaled sum) needs."""
    for body in ("A^{f32,g}_{a,c}", "A^{f32,g}_{a,c}*A^{f32,g}_{a,c}", "-(A^{f32,g}_{a,c}/2)"):
        program = _program(f"L^{{4}}_{{a=0}}L^{{37}}_{{c=0}}[D^{{f32,g}}_{{a}}=D^{{f32,g}}_{{a}}+{body};];",
                           ("A", (4, 37), "input"), ("D", (4,), "output"))
        after = apply_action(program, "layout_transformation(nest=0, tensor=A, layout=[0,[1,pad,40]])")
        assert after.nests[1].loops[1].extent == 40, body
        assert verify(after, program, trials=1).equivalent, body


@pytest.mark.parametrize("action, message", [
    ("layout_transformation(nest=0, tensor=A, layout=[0,[1,pad,37]])", "does not enlarge"),
    ("layout_transformation(nest=0, tensor=A, layout=[[0,div,29],[0,mod,29],[1,pad,40]])", "not both"),
])
def test_bad_pads_are_refused(matmul, action, message):
    with pytest.raises(IllegalActionError, match=message):
        apply_action(matmul.program, action)


def test_pad_needs_a_plain_subscript_and_a_copy():
    conv = get_workload("level1/conv2d_square_input_square_kernel", preset="tiny").program
    with pytest.raises(IllegalActionError, match="plain loop variable"):
        apply_action(conv, "layout_transformation(nest=0, tensor=A, layout=[0,1,[2,pad,64],3])")
    program = _program("L^{4}_{a=0}L^{37}_{c=0}[E^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];"
                       "L^{4}_{a=0}L^{37}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+E^{f32,g}_{a,c};];",
                       ("A", (4, 37), "input"), ("D", (4,), "output"))
    with pytest.raises(IllegalActionError, match="in place cannot pad"):
        apply_action(program, "set_storage_layout(tensor=E, layout=[0,[1,pad,40]])")


def test_infer_reads_the_pad_back(matmul):
    one = apply_action(matmul.program, PAD_A)
    two = apply_action(one, PAD_C)
    assert LAYOUT.infer(matmul.program, one) == [Action.parse(PAD_A)]
    assert LAYOUT.infer(one, two) == [Action.parse(PAD_C)]
