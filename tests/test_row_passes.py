"""Row-pass chains (agents/row_passes.py): built from the menu, the expected shape on softmax (one exp, lane-wise
reductions, vector passes, one nest per row), equivalent to the model when applied, and nothing for
contractions, which the register tiles handle."""
from __future__ import annotations

from agents.common import Search
from agents.focus import _row_passes
from agents.row_passes import row_pass_chain
from steptp_env import verify
from steptp_env.env import StepTPEnv
from steptp_env.strategies.base import apply_action, candidates
from steptp_env.workloads import get_workload

SOFTMAX = ["common_subexpression_elimination(nests=[1])", "reduction_factorization(nest=0, loop=c, lanes=16)",
           "reduction_factorization(nest=3, loop=c, lanes=16)", "loop_split(nest=2, loop=c, factor=16)",
           "loop_vectorization(nest=2, loop=c)", "loop_split(nest=5, loop=c, factor=16)",
           "loop_vectorization(nest=5, loop=c)"] + ["operator_fusion(nest=0, scope=g, depth=1)"] * 5


def test_softmax_chain_is_on_the_menu_and_equivalent():
    program = get_workload("level1/softmax", "small").program
    chain = row_pass_chain(program)
    assert chain == SOFTMAX
    end = program
    for action in chain:
        assert action in {c.text for c in candidates(end)}
        end = apply_action(end, action)
    assert len(end.nests) == 1 and end.leir.count("exp(") == 1 and end.leir.count("V^{16}") == 4
    assert verify(end, program, trials=2).equivalent


def test_a_scalar_nest_between_row_passes_is_passed_over():
    """frobenius_norm's sqrt of the sum is a nest without loops (the leaderboard's focus run raised there)."""
    program = get_workload("level1/frobenius_norm", "tiny").program
    assert any(not nest.loops for nest in program.nests)
    end = program
    for action in row_pass_chain(program):
        end = apply_action(end, action)
    assert end is not program and verify(end, program, trials=2).equivalent


def test_contractions_are_left_to_the_tiles():
    assert row_pass_chain(get_workload("level1/matmul_square", "small").program) == []
    mha = get_workload("level2/mha", "tiny").program
    fused = mha
    for action in row_pass_chain(mha):
        fused = apply_action(fused, action)
    kept = {t for t in (str(n) for n in mha.nests)} & {t for t in (str(n) for n in fused.nests)}
    assert len(kept) >= 6  # the projections, q.k and p.v are untouched


def test_focus_plays_the_chain_whole_before_its_phases_where_there_is_no_contraction(tmp_path):
    env = StepTPEnv("level1/softmax", "tiny", mode="hybrid", store=tmp_path / "s.sqlite")
    search = Search(env, 64, 0, "focus")
    start = search.root()
    end = _row_passes(search, start)
    chain = row_pass_chain(start.env.program)
    assert [step["action"] for step in search.trajectory] == chain
    sources = [step["source"] for step in search.trajectory]
    assert sources[-1] in ("measured", "stored") and set(sources[:-1]) == {"predicted"}
    assert all(step["verified"] for step in search.trajectory)
    assert end is start or (search.trusted(end) and end.runtime_s < start.runtime_s)
    assert search.spent == 2  # the start program and the end
