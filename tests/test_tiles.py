"""Register-tile chains: built from the menu for contractions only, exact (the same chain as the menu
ceiling's hand-written one), equivalent to the model when played, and played by the focus agent with the
middle steps predicted and the end measured (`RuntimeOracle.forcing`)."""
from __future__ import annotations

import pytest

from agents.common import Search
from agents.focus import _register_tiles
from agents.tiles import register_tile_chains
from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol, measure
from steptp_env.strategies.base import apply_action, candidates
from steptp_env.workloads import get_workload

MENU_CEILING_4X64 = [
    "loop_tiling(nest=0, loops=[a,c], factors=[4,64])", "loop_reorder(nest=0, order=[f,g,d,a,c])",
    "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=g)", "loop_split(nest=0, loop=c, factor=16)",
    "loop_vectorization(nest=0, loop=c)", "loop_unrolling(nest=0, loop=j)", "loop_unrolling(nest=0, loop=a)"]
"""benchmarks/menu_ceiling.py's register tile of matmul_square at `small`, written by hand."""


def test_matmul_chain_is_the_hand_written_micro_kernel_and_every_action_is_on_the_menu():
    program = get_workload("level1/matmul_square", "small").program
    chains = register_tile_chains(program, 0)
    assert len(chains) == 2 and chains[0] == MENU_CEILING_4X64
    assert chains[1][0] == "loop_tiling(nest=0, loops=[a,c], factors=[8,32])"
    for action in chains[1]:
        assert action in {c.text for c in candidates(program)}
        program = apply_action(program, action)


def test_only_contractions_with_a_vector_axis_get_chains():
    mha = get_workload("level2/mha", "small").program
    with_chains = [n for n in range(len(mha.nests)) if register_tile_chains(mha, n)]
    assert with_chains == [0, 4, 8, 12, 17, 20]  # the projections, q.k and p.v; not the exp sum or copies
    assert "layout_transformation(nest=0, tensor=C, layout=[1,0])" in register_tile_chains(mha, 0)[0]
    assert register_tile_chains(get_workload("level1/matvec", "small").program, 0) == []  # one output axis


CONV2D_CHANNEL_TILE = [
    "loop_tiling(nest=0, loops=[d,f], factors=[2,2])", "loop_reorder(nest=0, order=[c,j,k,d,f,g,h,i,a])",
    "loop_reorder(nest=0, order=[c,j,k,f,g,h,i,a,d])", "loop_reorder(nest=0, order=[c,j,k,g,h,i,a,d,f])",
    "loop_reorder(nest=0, order=[j,k,g,h,i,a,d,f,c])", "layout_transformation(nest=0, tensor=C, layout=[1,2,3,0])",
    "cache_read_write(nest=1, tensor=D, mode=write, scope=l, at=k)", "set_storage_layout(tensor=F, layout=[0,2,3,1])",
    "loop_vectorization(nest=1, loop=c)", "loop_unrolling(nest=1, loop=a)", "loop_unrolling(nest=1, loop=d)",
    "loop_unrolling(nest=1, loop=f)"]
"""conv2d at `small` (62x62 pixels: no GEMM tile divides them): 16 output channels as the lanes of 2x2x2
accumulators (both images of the batch whole, since 62 = 2 x 31 allows only 2x2 pixels), the weights packed
[in, kh, kw, out], the accumulator stored channels last; the reorders the menu does not offer in one move
are played as moves of one loop innermost."""


def test_convolutions_get_channel_tiles_from_the_menu():
    workload = get_workload("level1/conv2d_square_input_square_kernel", "small")
    program = workload.program
    assert register_tile_chains(program, 0) == [CONV2D_CHANNEL_TILE]  # 8 accumulators: the half-size limit (8) picks it too
    for action in CONV2D_CHANNEL_TILE:
        assert action in {c.text for c in candidates(program)}, action
        program = apply_action(program, action)
    assert "U^{2}_{a=0}U^{2}_{d=0}U^{2}_{f=0}V^{16}_{c=0}[F^{f32,l}_{a,j*2+d,k*2+f,c}=F^{f32,l}_{a,j*2+d,k*2+f,c}+" \
        in program.leir
    check = measure(program, workload, "llvm", Protocol(threads=1), timing=False)  # the batch whole: tiny has one
    assert check.ok, check.error
    conv1d = register_tile_chains(get_workload("level1/conv1d", "small").program, 0)
    # 64 channels = 4 vectors: 2x2 rows (batch and pixel, not adjacent: two splits), then 2 rows
    assert [chain[:2] for chain in conv1d] == [
        ["loop_split(nest=0, loop=a, factor=2)", "loop_split(nest=0, loop=d, factor=2)"],
        ["loop_split(nest=0, loop=d, factor=2)", "loop_reorder(nest=0, order=[a,c,h,f,g,d])"]]


@pytest.mark.parametrize("uri", ["level1/matmul_square", "level2/gemm_relu_divide", "level1/matmul_batched",
                                 "level1/conv2d_square_input_square_kernel", "level1/conv1d",
                                 "level1/conv2d_strided_bias", "level1/conv_depthwise_2d_square_input_square_kernel"])
def test_chains_are_equivalent_to_the_model(uri):
    workload = get_workload(uri, "tiny")
    chains = next(filter(None, (register_tile_chains(workload.program, n)
                                for n in range(len(workload.program.nests)))))  # the first tiled nest's
    for chain in chains:
        program = workload.program
        for action in chain:
            program = apply_action(program, action)
        check = measure(program, workload, "llvm", Protocol(threads=1), timing=False)
        assert check.ok, (chain, check.error)


def test_forcing_measures_or_predicts_whatever_the_model_says(tmp_path):
    env = StepTPEnv("level1/matmul_square", "tiny", mode="hybrid", store=tmp_path / "s.sqlite")
    env.reset(seed=0)
    split, reorder = "loop_split(nest=0, loop=d, factor=8)", "loop_reorder(nest=0, order=[a,d,c])"
    with env.oracle.forcing(True):
        info = env.fork().step(split)[4]
    assert info["error"] is None and info["runtime_source"] == "measured"
    with env.oracle.forcing(False):
        info = env.fork().step(reorder)[4]
    assert info["error"] is None and info["runtime_source"] == "predicted" and info["verified"]
    assert env.fork().step(split)[4]["runtime_source"] == "measured"  # measured before: measured either way


def test_focus_plays_tile_chains_with_only_their_ends_measured(tmp_path):
    env = StepTPEnv("level1/matmul_square", "tiny", mode="hybrid", store=tmp_path / "s.sqlite")
    search = Search(env, 64, 0, "focus")
    start = search.root()
    best = _register_tiles(search, start, 0)
    chains = register_tile_chains(start.env.program, 0)
    assert [step["action"] for step in search.trajectory] == chains[0] + chains[1]
    sources = [step["source"] for step in search.trajectory]
    ends = {len(chains[0]) - 1, len(search.trajectory) - 1}
    assert all(s in ("measured", "stored") for i, s in enumerate(sources) if i in ends)
    assert all(s == "predicted" for i, s in enumerate(sources) if i not in ends)
    assert all(step["verified"] for step in search.trajectory)
    assert best is start or (search.trusted(best) and best.runtime_s < start.runtime_s)
    assert search.spent == 3  # the start program and the two ends


def test_chains_respect_the_episode_step_limit(tmp_path):
    env = StepTPEnv("level1/matmul_square", "tiny", mode="hybrid", store=tmp_path / "s.sqlite", max_steps=4)
    search = Search(env, 64, 0, "focus")
    assert _register_tiles(search, search.root(), 0) is search.root() and search.trajectory == []


def test_a_tile_spanning_the_whole_row_splits_only_the_rows():
    mha = get_workload("level2/mha", "small").program
    chain = register_tile_chains(mha, 17)[0]  # p.v: 16 output columns, one vector
    assert chain[0] == "loop_split(nest=17, loop=d, factor=8)" and "loop_tiling" not in " ".join(chain)
    assert chain[-2:] == ["loop_vectorization(nest=17, loop=f)", "loop_unrolling(nest=17, loop=d)"]
