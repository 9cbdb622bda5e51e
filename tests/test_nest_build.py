"""Checking builds nest by nest (`measure.nest_build`): the outputs of the whole program's kernel, only the
nests not compiled before compiled again, and a wrong nest still caught beside reused ones."""
from __future__ import annotations

import numpy as np
import pytest

from steptp_env import Program
from steptp_env.data.verification import check
from steptp_env.errors import StepTPError
from steptp_env.measure import nest_build
from steptp_env.measure.build import build
from steptp_env.measure.inputs import random_inputs
from steptp_env.strategies import apply_action, candidates
from steptp_env.workloads import get_workload

SIG = [{"name": "A", "shape": [8], "dtype": "float32"}, {"name": "B", "shape": [8], "dtype": "float32"},
       {"name": "C", "shape": [8], "dtype": "float32", "role": "output"}]
CHAIN = ("L^{8}_{a=0}[T^{f32,g}_{a}=A^{f32,g}_{a}*2;];L^{8}_{a=0}[U^{f32,g}_{a}=T^{f32,g}_{a}+B^{f32,g}_{a};];"
         "L^{8}_{a=0}[C^{f32,g}_{a}=U^{f32,g}_{a}*3;];")
CROSS_NEST = [
    CHAIN,
    # an output written by one nest and updated in place by the next
    "L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a};];L^{8}_{a=0}[C^{f32,g}_{a}=C^{f32,g}_{a}+B^{f32,g}_{a};];",
    # a fresh accumulation (its first write reads the identity) and a reduction into a shared scalar
    "L^{8}_{a=0}[C^{f32,g}_{a}=C^{f32,g}_{a}+A^{f32,g}_{a};];L^{8}_{a=0}[S^{f32,g}_{0}=S^{f32,g}_{0}+B^{f32,g}_{a};];"
    "L^{8}_{a=0}[C^{f32,g}_{a}=C^{f32,g}_{a}*S^{f32,g}_{0};];",
    # an intermediate written in two halves by two nests, read by a third
    "L^{8}_{a=0}[P^{f32,g}_{a}=A^{f32,g}_{a};];L^{8}_{a=0}[P^{f32,g}_{a+8}=B^{f32,g}_{a};];"
    "L^{8}_{a=0}[C^{f32,g}_{a}=P^{f32,g}_{a}-P^{f32,g}_{a+8};];",
]


def _programs_of(uri: str) -> list[Program]:
    """A suite workload's start program and the programs its strategies' first candidates make of it."""
    start = get_workload(uri, preset="tiny").program
    found = {}
    for action in candidates(start):
        found.setdefault(action.strategy, action)
    return [start, *(apply_action(start, action) for action in found.values())]


def _same_outputs(program: Program) -> None:
    inputs = random_inputs(program, seed=3)
    whole = build(program, "llvm", 1)(inputs)
    by_nest = nest_build.build_by_nest(program, 1)(inputs)
    assert set(whole) == set(by_nest)
    for name in whole:
        np.testing.assert_allclose(by_nest[name], whole[name], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("text", CROSS_NEST)
def test_tensors_shared_between_nests_give_the_whole_programs_outputs(text):
    _same_outputs(Program.parse(text, SIG))


@pytest.mark.parametrize("uri", ["level1/softmax", "level2/matmul_softmax", "level2/mha"])
def test_suite_programs_and_their_steps_give_the_whole_programs_outputs(uri):
    programs = _programs_of(uri)
    assert len(programs) > 5
    for program in programs:
        _same_outputs(program)


def test_only_nests_not_compiled_before_are_compiled():
    chain = Program.parse(CHAIN, SIG)
    nest_build.build_by_nest(chain, 1)
    compiled = len(nest_build._COMPILED)
    nest_build.build_by_nest(chain, 1)
    assert len(nest_build._COMPILED) == compiled
    renamed = Program.parse(CHAIN.replace("T^", "X^").replace("U^", "Y^"), SIG)
    nest_build.build_by_nest(renamed, 1)
    assert len(nest_build._COMPILED) == compiled  # the same code, whatever its tensors are called
    changed = Program.parse(CHAIN.replace("*3;", "*4;"), SIG)
    inputs = random_inputs(changed, seed=0)
    out = nest_build.build_by_nest(changed, 1)(inputs)["C"]
    assert len(nest_build._COMPILED) == compiled + 1
    np.testing.assert_allclose(out, (inputs["A"] * 2 + inputs["B"]) * 4, rtol=1e-6)
    nest_build.build_by_nest(chain, 0)
    assert len(nest_build._COMPILED) == compiled + 4  # another LLVM level is other code


def test_a_wrong_nest_beside_reused_ones_is_caught_by_the_check():
    reference = Program.parse(CHAIN, SIG)
    assert check(reference, reference)["equivalent"]
    wrong = Program.parse(CHAIN.replace("+B^", "-B^"), SIG)
    report = check(wrong, reference)
    assert not report["equivalent"] and report["max_abs_err"] > 0


def test_a_kernel_built_by_nest_cannot_be_timed():
    kernel = nest_build.build_by_nest(Program.parse(CHAIN, SIG), 1)
    with pytest.raises(StepTPError, match="for checks"):
        kernel.time(random_inputs(kernel.program, seed=0))
