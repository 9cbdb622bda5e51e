"""Carrying a chain from one nest to its twins: `nest_renaming` matches nests up to names only, `transfer`
rewrites a chain exactly (the twin ends as the focus nest did, renamed, and the program stays equivalent to
the model) or refuses it, and the focus agent replays a phase's chain on the twins."""
from __future__ import annotations

import pytest

from agents.common import Move, Search
from agents.focus import _carry_over
from agents.transfer import transfer, twins
from steptp_env.env import StepTPEnv
from steptp_env.ir.canonical import nest_renaming
from steptp_env.ir.printer import print_nest
from steptp_env.measure import Protocol, measure
from steptp_env.strategies import apply_action
from steptp_env.workloads import get_workload

CHAIN = ["layout_transformation(nest=0, tensor=C, layout=[1,0])", "loop_reorder(nest=1, order=[a,c,f,d])",
         "loop_split(nest=1, loop=d, factor=8)", "loop_vectorization(nest=1, loop=d)"]
"""A projection of the attention block made a GEMM over a transposed weight copy, vectorised along its
output columns (the copy is a new nest before the GEMM, so the GEMM becomes nest 1)."""


@pytest.fixture(scope="module")
def mha():
    return get_workload("level2/mha", "tiny")


def texts(program) -> list[str]:
    return [print_nest(nest) for nest in program.nests]


def test_nest_renaming_matches_names_only(mha):
    nests = texts(mha.program)
    renaming = nest_renaming(nests[0], nests[4])
    assert renaming is not None and renaming.tensors["C"] != "C" and renaming.tensors["K"] != "K"
    assert renaming.loops == {v: v for v in renaming.loops}
    assert nest_renaming(nests[0], nests[0]).tensors == {t: t for t in renaming.tensors}
    assert nest_renaming(nests[0], nests[12]) is None  # another shape
    assert nest_renaming(nests[0], nests[0].replace("+", "-", 1)) is None  # another operator
    assert nest_renaming(nests[0], nests[0].replace("f32,g", "f32,l", 1)) is None  # another scope
    swapped = nests[0].replace("A^", "Tmp^").replace("C^", "A^").replace("Tmp^", "C^")
    assert nest_renaming(nests[0], swapped) is not None
    aliased = nests[0].replace("C^", "A^")  # two tensors onto one name
    assert nest_renaming(nests[0], aliased) is None


def test_twins_are_the_projections(mha):
    assert twins(mha.program, 0) == [4, 8, 20]
    assert twins(mha.program, 12) == []


def test_transfer_rewrites_a_chain_exactly_and_the_result_is_equivalent(mha):
    source = mha.program
    for action in CHAIN:
        source = apply_action(source, action)
    moved = transfer(mha.program, 0, CHAIN, mha.program, 4)
    assert moved is not None and len(moved) == len(CHAIN) and moved != CHAIN
    assert moved[0].startswith("layout_transformation(nest=4, tensor=E,") and "nest=5" in moved[1]
    target = mha.program
    for action in moved:
        target = apply_action(target, action)
    before, after = texts(source), texts(target)
    assert nest_renaming(before[0], after[4]) is not None  # the twin's copy nest ...
    assert nest_renaming(before[1], after[5]) is not None  # ... and its vectorised GEMM
    assert "V^{8}" in after[5] and after[:4] == texts(mha.program)[:4]
    check = measure(target, mha, "llvm", Protocol(threads=1), timing=False)
    assert check.ok, check.error


def test_transfer_refuses_what_does_not_carry_over(mha):
    assert transfer(mha.program, 0, CHAIN, mha.program, 12) is None  # not a twin
    assert transfer(mha.program, 0, ["loop_split(nest=0, loop=q, factor=2)"], mha.program, 4) is None
    assert transfer(mha.program, 0, ["compute_inline(nest=2, consumer=3)"], mha.program, 4) is None  # off-region


def test_focus_agent_replays_a_phase_on_the_twins(tmp_path):
    """A phase's chain (here one reorder the packaged model predicts faster at `tiny`) is replayed on the
    three other projections; each replay is kept because it ends faster, and the twins' new nests are
    marked visited."""
    chain = ["loop_reorder(nest=0, order=[a,d,f,c])"]
    env = StepTPEnv("level2/mha", "tiny", mode="model", store=tmp_path / "s.sqlite", max_steps=16)
    search = Search(env, 40, 0, "focus")
    start = search.root()
    reached = search.step(start, Move(chain[0], chain[0]))
    done: set[str] = set()
    end = _carry_over(search, start, 0, reached, done)
    replayed = [step["action"] for step in search.trajectory[1:]]
    assert replayed == ["loop_reorder(nest=4, order=[a,d,f,c])", "loop_reorder(nest=8, order=[a,d,f,c])",
                        "loop_reorder(nest=20, order=[a,d,f,c])"]
    assert end.depth == 4 and end.runtime_s < reached.runtime_s
    assert done == {texts(end.env.program)[i] for i in (4, 8, 20)}
