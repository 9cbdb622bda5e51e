"""cache_read_write's local accumulator (`mode=write, at=X`): its form, its menu, its refusals, the size TVM
allocates for the tile, and equivalence of the tile and of chains through it. (The forms without `at` are
covered with the other memory strategies in test_strategies_memory.py.)"""
from __future__ import annotations

import pytest

from steptp_env import Program, lower, verify
from steptp_env.errors import IllegalActionError
from steptp_env.strategies import REGISTRY, Action, apply_action, canonical_text


def _program(text: str, *specs: tuple[str, tuple[int, ...], str], dtype: str = "float64") -> Program:
    return Program.parse(text, [{"name": n, "shape": list(s), "dtype": dtype, "role": r} for n, s, r in specs])


# D = A @ C with D's columns tiled by 4 (c outer, f inner) and the reduction loop d between them
MATMUL = _program("L^{4}_{a=0}L^{2}_{c=0}L^{6}_{d=0}L^{4}_{f=0}[D^{f64,g}_{a,c*4+f}=D^{f64,g}_{a,c*4+f}"
                  "+A^{f64,g}_{a,d}*C^{f64,g}_{d,c*4+f};];",
                  ("A", (4, 6), "input"), ("C", (6, 8), "input"), ("D", (4, 8), "output"))
# the same at the size the benchmarks use: a whole-matrix cache (256 KiB) would not be local, a tile is
BIG = _program("L^{256}_{a=0}L^{16}_{c=0}L^{256}_{d=0}L^{16}_{f=0}[D^{f32,g}_{a,c*16+f}=D^{f32,g}_{a,c*16+f}"
               "+A^{f32,g}_{a,d}*C^{f32,g}_{d,c*16+f};];",
               ("A", (256, 256), "input"), ("C", (256, 256), "input"), ("D", (256, 256), "output"),
               dtype="float32")
# a row maximum beside an elementwise equation, in float32 with a vector loop
ROWMAX = _program("L^{3}_{a=0}L^{8}_{c=0}V^{4}_{d=0}[M^{f32,g}_{a,d}=max(M^{f32,g}_{a,d},A^{f32,g}_{a,c*4+d});"
                  "E^{f32,g}_{a,c*4+d}=A^{f32,g}_{a,c*4+d}*2;];",
                  ("A", (3, 32), "input"), ("M", (3, 4), "output"), ("E", (3, 32), "output"), dtype="float32")


def test_the_tile_form():
    after = apply_action(MATMUL, "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=c)")
    expected = ("L^{4}_{a=0}L^{2}_{c=0}[L^{6}_{d=0}L^{4}_{f=0}[E^{f64,l}_{a,c*4+f}=E^{f64,l}_{a,c*4+f}"
                "+A^{f64,g}_{a,d}*C^{f64,g}_{d,c*4+f};];L^{4}_{g=0}[D^{f64,g}_{a,c*4+g}=E^{f64,l}_{a,c*4+g};];];")
    assert canonical_text(after) == canonical_text(Program.parse(expected, after.signature)), after.leir
    assert verify(after, MATMUL, trials=2).equivalent
    # vector and unrolled loops keep their kind in the copy, so the store is vectorised like the update
    after = apply_action(ROWMAX, "cache_read_write(nest=0, tensor=M, mode=write, scope=l, at=a)")
    cache = next(iter(after.intermediates))
    assert f"V^{{4}}_{{f=0}}[M^{{f32,g}}_{{a,f}}={cache}^{{f32,l}}_{{a,f}};]" in after.leir, after.leir
    assert verify(after, ROWMAX, trials=2).equivalent


def test_a_tile_at_the_only_loop_of_a_fused_nest_round_trips():
    """At the innermost loop of a nest whose body holds inner nests (a row fusion's), the tile's body is the
    nest's own statements, not a group without loops, which LEIR cannot write and the lowering could not
    place (the printed text failed to parse; its placement compared loop keys of different depths)."""
    rows = _program("L^{3}_{a=0}L^{8}_{c=0}[M^{f32,g}_{a}=max(M^{f32,g}_{a},A^{f32,g}_{a,c});];"
                    "L^{3}_{a=0}L^{8}_{c=0}[E^{f32,g}_{a,c}=A^{f32,g}_{a,c}-M^{f32,g}_{a};];",
                    ("A", (3, 8), "input"), ("E", (3, 8), "output"), dtype="float32")
    fused = apply_action(rows, "operator_fusion(nest=0, scope=g, depth=1)")
    after = apply_action(fused, "cache_read_write(nest=0, tensor=M, mode=write, scope=l, at=a)")
    assert "[[" not in after.leir and Program.parse(after.leir, after.signature).leir == after.leir
    lower(after, "llvm", tvm_form=True)
    assert verify(after, rows, trials=2).equivalent


def test_the_tile_is_what_tvm_allocates():
    """The LEIR cache keeps the tensor's shape; TVM allocates it inside the loop, only the elements one
    iteration writes (16 floats here, one AVX-512 register), and the lowering keeps it local because that
    part, not the whole 256 KiB, is under the local limit."""
    import tvm

    from steptp_env.lower.tir import LOCAL_SCOPE_LIMIT_BYTES, placed_bytes

    after = apply_action(BIG, "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=c)")
    cache = next(name for name in after.intermediates)
    assert after.tensors[cache].shape == (256, 256) and 256 * 256 * 4 > LOCAL_SCOPE_LIMIT_BYTES
    assert placed_bytes(after, cache) == 16 * 4
    module = lower(after, "llvm")
    passes = tvm.transform.Sequential([tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                                       tvm.s_tir.transform.ConvertBlocksToOpaque(),
                                       tvm.s_tir.transform.CompactBufferAllocation()])
    allocated = _allocations(passes(module)["main"].body, cache)
    assert [tuple(int(d) for d in b.shape) for b in allocated] == [(1, 16)]
    assert [b.scope() for b in allocated] == ["local"]
    # the same cache for the whole nest spans the matrix: global, as before
    whole = apply_action(BIG, "cache_read_write(nest=0, tensor=D, mode=write, scope=l)")
    assert placed_bytes(whole, cache) == 256 * 256 * 4


def _allocations(stmt, name: str) -> list:
    """The buffers named `name` that a lowered body allocates (in a block's list, or, once TVM's passes
    have made blocks opaque, as an allocation statement)."""
    import tvm

    if isinstance(stmt, tvm.tirx.SeqStmt):
        return [b for s in stmt.seq for b in _allocations(s, name)]
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        return [b for b in stmt.block.alloc_buffers if b.name == name] + _allocations(stmt.block.body, name)
    if isinstance(stmt, tvm.tirx.AllocBuffer) and stmt.buffer.name == name:
        return [stmt.buffer]
    body = getattr(stmt, "body", None)
    return _allocations(body, name) if body is not None else []


def test_the_menu_offers_each_loop_that_owns_its_elements():
    actions = REGISTRY["cache_read_write"].candidates(MATMUL, "llvm")
    tiles = [a.text for a in actions if a.get("at") is not None]
    assert tiles == ["cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=a)",
                     "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=c)"]
    assert actions[-2:] == [Action.parse(t) for t in tiles]  # after every whole-nest form: their ranks stay
    assert not [a for a in REGISTRY["cache_read_write"].candidates(MATMUL, "cuda") if a.get("at") is not None]
    assert [a["at"] for a in REGISTRY["cache_read_write"].candidates(ROWMAX, "llvm") if a.get("at")] == ["a"]
    for action in actions:
        assert verify(apply_action(MATMUL, action), MATMUL, trials=1).equivalent, action.text


REFUSALS = [  # (program, or a function making it when the test runs; parameters; the reason's words)
    (MATMUL, "scope=l, at=d", "reduce into it"),
    (MATMUL, "scope=l, at=f", "reduce into it"),
    (MATMUL, "scope=l, at=x", "at must name one of nest 0's own loops"),
    (MATMUL, "scope=g, at=c", "local or shared"),
    (ROWMAX, "scope=l, at=c", "reduce into it"),  # its tensor is M
    (lambda: _program("L^{4}_{a=0}V^{4}_{c=0}L^{3}_{d=0}[D^{f64,g}_{a,c}=D^{f64,g}_{a,c}+A^{f64,g}_{a,c,d};];",
                      ("A", (4, 4, 3), "input"), ("D", (4, 4), "output")), "scope=l, at=c", "vector loops"),
    (lambda: _program("L^{4}_{a=0}L^{3}_{c=0}[D^{f64,g}_{a,c}=A^{f64,g}_{a,c}*2;];",
                      ("A", (4, 3), "input"), ("D", (4, 3), "output")), "scope=l, at=a", "would only add a copy"),
    (lambda: _program("L^{2}_{a=0}L^{3}_{c=0}L^{16384}_{d=0}[D^{f64,g}_{a,d}=D^{f64,g}_{a,d}+A^{f64,g}_{a,c,d};];",
                      ("A", (2, 3, 16384), "input"), ("D", (2, 16384), "output")), "scope=l, at=a",
     "more than the 65536 bytes"),
    (lambda: _program("L^{4}_{a=0}L^{3}_{c=0}[D^{f64,g}_{a}=D^{f64,g}_{a}+A^{f64,g}_{a,c};"
                      "E^{f64,g}_{a,c}=D^{f64,g}_{(a+1)%4}*2;];",
                      ("A", (4, 3), "input"), ("D", (4,), "output"), ("E", (4, 3), "output")), "scope=l, at=a",
     "also accesses D"),
]


@pytest.mark.parametrize("program, params, reason", REFUSALS)
def test_refusals_say_why(program, params, reason):
    program = program() if callable(program) else program
    text = f"cache_read_write(nest=0, tensor={'M' if program is ROWMAX else 'D'}, mode=write, {params})"
    with pytest.raises(IllegalActionError, match=reason):
        apply_action(program, text)
    assert Action.parse(text) not in REGISTRY["cache_read_write"].candidates(program, "llvm")


def test_a_tile_read_inside_its_nest_and_elsewhere():
    """The nest reads the running sum beside the reduction (the tile gives the same partial values) and a
    later nest reads the result at other elements (from the tensor, which the copy filled)."""
    program = _program("L^{4}_{a=0}L^{3}_{c=0}[D^{f64,g}_{a}=D^{f64,g}_{a}+A^{f64,g}_{a,c};E^{f64,g}_{a,c}="
                       "D^{f64,g}_{a}*A^{f64,g}_{a,c};];L^{4}_{a=0}[F^{f64,g}_{a}=D^{f64,g}_{(a+1)%4};];",
                       ("A", (4, 3), "input"), ("E", (4, 3), "output"), ("F", (4,), "output"))
    after = apply_action(program, "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=a)")
    assert verify(after, program, trials=2).equivalent


def test_at_takes_mode_write_and_the_parameter_sets_are_checked():
    with pytest.raises(IllegalActionError, match="takes mode=write"):
        apply_action(MATMUL, "cache_read_write(nest=0, tensor=A, mode=read, scope=l, at=a)")
    with pytest.raises(IllegalActionError, match="takes parameters"):
        apply_action(MATMUL, "cache_read_write(nest=0, tensor=D, mode=write, at=a)")


def test_a_register_tiled_chain_through_the_tile_is_equivalent():
    """The chain the tile exists for: rows blocked by 2, the tile inside the row block holding 2x4 outputs,
    the reduction loop outside the tile's columns, the column loops vectorised. Built and compared in
    float32 (the build vectorises the V loops)."""
    program = _program("L^{4}_{a=0}L^{8}_{c=0}L^{6}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}"
                       "*C^{f32,g}_{d,c};];", ("A", (4, 6), "input"), ("C", (6, 8), "input"),
                       ("D", (4, 8), "output"), dtype="float32")
    chain = ["loop_split(nest=0, loop=a, factor=2)", "loop_reorder(nest=0, order=[f,d,a,c])",
             "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=f)",
             "loop_vectorization(nest=0, loop=c)"]
    after = program
    for text in chain:
        after = apply_action(after, text)
    assert "E^{f32,l}" in after.leir and "V^{8}_{c=0}" in after.leir, after.leir
    assert verify(after, program, trials=3).equivalent
