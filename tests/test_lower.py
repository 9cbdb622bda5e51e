"""Lowering: every reference program lowers deterministically, builds for the CPU and yields CUDA source."""
from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi

from steptp_env import LoweringError, Program, build, lower
from steptp_env.ir.interpret import interpret
from steptp_env.measure import random_inputs


def test_every_reference_program_lowers_deterministically_and_builds(ref_programs):
    for row in ref_programs:
        program = Program.parse(row["leir"], row["signature"])
        for target in ("llvm", "cuda"):
            first, second = lower(program, target), lower(program, target)
            assert tvm_ffi.structural_equal(first, second), (row["id"], target)
        assert build(program, "llvm").executable is not None
        source = build(program, "cuda").source
        assert "__global__" in source, row["id"]


def test_small_reference_programs_match_the_interpreter(ref_programs):
    small = [r for r in ref_programs if r["loop_iterations"] <= 20_000]
    assert len(small) >= 5
    for row in small:
        program = Program.parse(row["leir"], row["signature"])
        inputs = random_inputs(program, 0)
        expected = interpret(program, inputs)
        got = build(program)(inputs)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-12, err_msg=row["id"])


SIG = [{"name": "A", "shape": [4, 4], "dtype": "float32"}, {"name": "C", "shape": [4, 4], "dtype": "float32",
                                                              "role": "output"}]


def test_cuda_binding_rules():
    bound_twice = Program.parse("B^{4}_{tx=0}B^{4}_{txa=0}[C^{f32,g}_{tx,txa}=A^{f32,g}_{tx,txa};];", SIG)
    with pytest.raises(LoweringError, match="bound twice"):
        lower(bound_twice, "cuda")
    unknown_axis = Program.parse("B^{4}_{qa=0}L^{4}_{c=0}[C^{f32,g}_{qa,c}=A^{f32,g}_{qa,c};];", SIG)
    with pytest.raises(LoweringError, match="names no GPU axis"):
        lower(unknown_axis, "cuda")
    # On the CPU the same B loops are plain serial loops.
    np.testing.assert_array_equal(build(bound_twice)({"A": np.eye(4, dtype="float32")})["C"], np.eye(4))


def test_unbound_nest_gets_a_single_thread_launch_on_cuda():
    program = Program.parse("L^{4}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{c,a};];", SIG)
    assert "blockIdx.x" in lower(program, "cuda").script()
    assert "__global__" in build(program, "cuda").source


def test_loop_kinds_lower_to_tvm_loop_kinds():
    program = Program.parse("P^{4}_{a=0}V^{4}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];"
                            "P^{4}_{a=0}P^{4}_{c=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+1;];"
                            "L^{4}_{a=0}U^{4}_{c=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}*1;];", SIG)
    script = lower(program).script()
    assert "T.parallel(4)" in script and "T.vectorized(4)" in script and "T.unroll(4)" in script
    assert script.count("T.parallel") == 2  # the inner P of the second nest runs serially
    a = np.arange(16, dtype="float32").reshape(4, 4)
    np.testing.assert_array_equal(build(program)({"A": a})["C"], a * 2 + 1)


def test_unsupported_target_is_a_lowering_error():
    program = Program.parse("L^{4}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c};];", SIG)
    with pytest.raises(LoweringError, match="unsupported target"):
        lower(program, "rocm")


@pytest.mark.parametrize("subscript", ["c%32", "(c+3)%32", "c%16"])
def test_a_wrapping_subscript_on_the_innermost_loop_stays_inside_its_buffer(subscript):
    """LLVM's loop vectorizer (LLVM 22 in TVM 0.27) compiles `G[a, c%32] = ...` over c < 64 into contiguous
    stores of 64 elements, past the 32 the subscript reaches (it corrupted the heap of a verification worker
    in the long chain run). The lowering splits such a loop so the subscript is the inner variable."""
    import tvm

    signature = [{"name": "C", "shape": [32, 32], "dtype": "float32", "role": "input"},
                 {"name": "G", "shape": [32, 64], "dtype": "float32", "role": "output"}]
    program = Program.parse(f"L^{{32}}_{{a=0}}L^{{64}}_{{c=0}}[G^{{f32,g}}_{{a,{subscript}}}"
                            f"=C^{{f32,g}}_{{a,{subscript}}};];", signature)
    source = np.random.default_rng(0).standard_normal((32, 32)).astype("float32")
    out = tvm.runtime.tensor(np.full((32, 64), np.nan, "float32"))
    build(program).main(tvm.runtime.tensor(source), out)
    assert np.isnan(out.numpy()[:, 32:]).all()  # nothing written past the elements the subscript names
    modulus = int(subscript.rsplit("%", 1)[1])
    assert np.array_equal(out.numpy()[:, :modulus], source[:, :modulus])


def _blocks(stmt, loops=()):
    """(block name, loop vars around it, whether it has a T.init()) for every block of a lowered body."""
    import tvm

    if isinstance(stmt, tvm.tirx.SeqStmt):
        return [b for s in stmt.seq for b in _blocks(s, loops)]
    if isinstance(stmt, tvm.tirx.For):
        return _blocks(stmt.body, loops + (stmt.loop_var.name,))
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        block = stmt.block
        return [(block.name_hint, loops, block.init is not None)] + _blocks(block.body, loops)
    body = getattr(stmt, "body", None)
    return _blocks(body, loops) if body is not None else []


REDUCTIONS = {
    # name: (program, signature)
    "matmul, a spatial loop inside the reduced one": (
        "L^{4}_{a=0}L^{3}_{d=0}L^{5}_{c=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];",
        [{"name": "A", "shape": [4, 3], "dtype": "float32"}, {"name": "B", "shape": [3, 5], "dtype": "float32"},
         {"name": "C", "shape": [4, 5], "dtype": "float32", "role": "output"}]),
    "row maximum, int32": (
        "L^{4}_{a=0}L^{6}_{d=0}[M^{i32,g}_{a}=max(M^{i32,g}_{a},A^{i32,g}_{a,d});];",
        [{"name": "A", "shape": [4, 6], "dtype": "int32"}, {"name": "M", "shape": [4], "dtype": "int32",
                                                           "role": "output"}]),
    "product, reduced loop of an outer nest": (
        "L^{3}_{d=0}[L^{4}_{a=0}[P^{f64,g}_{a}=P^{f64,g}_{a}*A^{f64,g}_{a,d};];];",
        [{"name": "A", "shape": [4, 3], "dtype": "float64"}, {"name": "P", "shape": [4], "dtype": "float64",
                                                             "role": "output"}]),
    "sum beside an elementwise equation, wrapped subscript": (
        "L^{2}_{d=0}L^{8}_{c=0}[S^{f32,g}_{c%4}=S^{f32,g}_{c%4}+A^{f32,g}_{d,c};T^{f32,g}_{d,c}=A^{f32,g}_{d,c}*2;];",
        [{"name": "A", "shape": [2, 8], "dtype": "float32"}, {"name": "S", "shape": [4], "dtype": "float32",
                                                             "role": "output"},
         {"name": "T", "shape": [2, 8], "dtype": "float32", "role": "output"}]),
}


@pytest.mark.parametrize("case", sorted(REDUCTIONS))
def test_reductions_are_initialised_before_their_outermost_reduced_loop(case):
    """No reduction keeps its initialisation inside its loops (a `T.init()` becomes `if (d == 0)` in the k
    loop, which keeps LLVM from holding the accumulator in registers): the lowering emits one init block
    per reduction, outside every reduced loop, and the results are the interpreter's."""
    from steptp_env.ir.analysis import reduction
    from steptp_env.ir.ast import equations

    text, signature = REDUCTIONS[case]
    program = Program.parse(text, signature)
    for target in ("llvm", "cuda"):
        blocks = _blocks(lower(program, target)["main"].body)
        assert not any(has_init for _, _, has_init in blocks), target
        reduced = {v for nest in program.nests for loops, eq in equations(nest)
                   if (red := reduction(loops, eq)) for v in red.reduced_vars}
        inits = [(name, loops) for name, loops, _ in blocks if name.endswith("_init")]
        assert inits and all(not reduced & set(loops) for _, loops in inits), (target, inits)
    kept = _blocks(lower(program, tvm_form=True)["main"].body)  # the form TVM's schedule rules expect
    assert any(has_init for _, _, has_init in kept) and not any(name.endswith("_init") for name, _, _ in kept)
    inputs = random_inputs(program, 0)
    expected = interpret(program, inputs)
    got = build(program)(inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, err_msg=name)



PLACEMENTS = {
    # name: (program, where the local intermediate E is allocated: the loop variable of its tile, or None)
    "a tile written then read in each iteration of a": (
        "L^{4}_{a=0}[L^{8}_{c=0}[E^{f32,l}_{a,c}=A^{f32,g}_{a,c}*2;];L^{8}_{d=0}[B^{f32,g}_{a,d}=E^{f32,l}_{a,d}+1;];];",
        "a"),
    "a reduction's tile, initialised inside a": (
        "L^{4}_{a=0}[L^{8}_{c=0}[E^{f32,l}_{a}=E^{f32,l}_{a}+A^{f32,g}_{a,c};];L^{1}_{d=0}[B^{f32,g}_{a,d}=E^{f32,l}_{a};];];",
        "a"),
    "a scan along c reads the element before: whole": (
        "L^{4}_{a=0}L^{8}_{c=0}[E^{f32,l}_{a,c}=E^{f32,l}_{a,c-1}+A^{f32,g}_{a,c};B^{f32,g}_{a,c}=E^{f32,l}_{a,c};];",
        None),
    "read before it is written in the iteration: whole (it reads memory no one wrote, so it is not run)": (
        "L^{4}_{a=0}L^{8}_{c=0}[B^{f32,g}_{a,c}=E^{f32,l}_{a,c};E^{f32,l}_{a,c}=A^{f32,g}_{a,c};];",
        None),
    "read as an index in another nest's target subscript: whole": (
        "L^{4}_{a=0}L^{8}_{c=0}[E^{i64,l}_{a,c}=7-c;];L^{4}_{a=0}L^{8}_{c=0}[B^{f32,g}_{a,E^{i64,l}_{a,c}}=A^{f32,g}_{a,c};];",
        None),
    "another element read than written: whole": (
        "L^{4}_{a=0}[L^{8}_{c=0}[E^{f32,l}_{a,c}=A^{f32,g}_{a,c};];L^{8}_{d=0}[B^{f32,g}_{a,d}=E^{f32,l}_{a,(d+1)%8};];];",
        None),
}


@pytest.mark.parametrize("case", sorted(PLACEMENTS))
def test_a_local_tile_is_allocated_inside_its_loop_only_when_each_iteration_reads_what_it_wrote(case):
    """`placement`: a local intermediate is allocated per iteration of a loop (and so shrunk to a tile by
    TVM) only where that cannot change results; the built kernel agrees with the interpreter either way."""
    from steptp_env.lower.tir import placement

    text, where = PLACEMENTS[case]
    shape = [4, 8]
    signature = [{"name": "A", "shape": shape, "dtype": "float32"},
                 {"name": "B", "shape": shape if "L^{1}" not in text else [4, 1], "dtype": "float32",
                  "role": "output"}]
    program = Program.parse(text, signature)
    key, size = placement(program, "E")
    assert (key is None) is (where is None), (case, key)
    names = [block for block, _, _ in _blocks(lower(program)["main"].body) if block.endswith("_tile")]
    assert bool(names) is (where is not None), names
    if where is not None:
        node, depth = key
        assert node == (0,) and program.nests[0].loops[depth].var == where and size < 4 * 8 * 4
    if "not run" in case:
        return
    inputs = random_inputs(program, 0)
    expected = interpret(program, inputs)
    got = build(program)(inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, err_msg=name)
