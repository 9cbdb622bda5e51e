"""The graph strategies (fusion, fission, inlining, expression splitting, tensor concat/split, common
subexpressions, dead code, statement reordering): legal candidates verify, illegal actions are refused with
a reason, actions round trip through their text, reference transitions are identified, and menus are
deterministic."""
from __future__ import annotations

import pytest

from steptp_env import verify
from steptp_env.data.reference_corpus import drop_stale_combine_loops
from steptp_env.errors import IllegalActionError
from steptp_env.ir.ast import equations
from steptp_env.ir.program import Program
from steptp_env.strategies import REGISTRY, Action, apply_action, identify

GRAPH = ("operator_fusion", "operator_fission", "compute_inline", "expression_splitting",
         "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators",
         "common_subexpression_elimination", "dead_code_elimination", "expression_reorder")
WORKLOADS = ("level1/softmax", "level1/matmul_square", "level1/layer_norm", "level1/conv1d",
             "level2/matmul_swish_scaling", "level2/log_log_add")
IDENTIFY_SAMPLE = 6
MAX_SAMPLE_CHARS = 900


def sig(**tensors) -> list[dict]:
    return [{"name": n, "shape": list(shape), "dtype": "float32", "role": role}
            for n, (shape, role) in tensors.items()]


HAND = {
    # two independent exp nests over 4 and 6 rows: concat along a, reorder, fuse is refused (extents differ)
    "twins": ("L^{4}_{a=0}L^{8}_{c=0}[D^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c});];"
              "L^{6}_{a=0}L^{8}_{c=0}[E^{f32,g}_{a,c}=exp(C^{f32,g}_{a,c});];",
              sig(A=((4, 8), "input"), C=((6, 8), "input"), D=((4, 8), "output"), E=((6, 8), "output"))),
    # tanh as sinh/cosh: common sub-expressions, fusion, inlining
    "sinhcosh": ("L^{4}_{a=0}L^{8}_{c=0}[K^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c})-exp(-A^{f32,g}_{a,c});];"
                 "L^{4}_{a=0}L^{8}_{c=0}[M^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c})+exp(-A^{f32,g}_{a,c});];"
                 "L^{4}_{a=0}L^{8}_{c=0}[C^{f32,g}_{a,c}=K^{f32,g}_{a,c}/M^{f32,g}_{a,c};];",
                 sig(A=((4, 8), "input"), C=((4, 8), "output"))),
    # F is never read: dead code; G is a transpose, read at other elements than it is written
    "dead": ("L^{4}_{a=0}L^{4}_{c=0}[F^{f32,g}_{a,c}=A^{f32,g}_{a,c}*3;];"
             "L^{4}_{a=0}L^{4}_{c=0}[G^{f32,g}_{c,a}=A^{f32,g}_{a,c}+1;];"
             "L^{4}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=G^{f32,g}_{a,c}*2;];",
             sig(A=((4, 4), "input"), C=((4, 4), "output"))),
    # a fused body (fission splits it) and a nest whose Y reads the running sums of X (fission refused)
    "fused": ("L^{8}_{a=0}[E^{f32,g}_{a}=A^{f32,g}_{a}*2;C^{f32,g}_{a}=E^{f32,g}_{a}+1;];"
              "L^{2}_{d=0}L^{4}_{f=0}[X^{f32,g}_{d}=X^{f32,g}_{d}+A^{f32,g}_{d*4+f};"
              "Y^{f32,g}_{d,f}=X^{f32,g}_{d};];",
              sig(A=((8,), "input"), C=((8,), "output"), Y=((2, 4), "output"))),
    # row passes with different inner loops: a row maximum, a row shifted by it, a row read with D mirrored
    "rows": ("L^{4}_{a=0}L^{8}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];"
             "L^{4}_{a=0}L^{2}_{c=0}L^{4}_{d=0}[E^{f32,g}_{a,c*4+d}=exp(A^{f32,g}_{a,c*4+d}-D^{f32,g}_{a});];"
             "L^{4}_{a=0}L^{8}_{c=0}[C^{f32,g}_{a,c}=E^{f32,g}_{a,c}-D^{f32,g}_{3-a};];",
             sig(A=((4, 8), "input"), C=((4, 8), "output"))),
    "matmul": ("L^{8}_{a=0}L^{12}_{c=0}L^{16}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}*C^{f32,g}_{d,c};];",
               sig(A=((8, 16), "input"), C=((16, 12), "input"), D=((8, 12), "output"))),
    # a padded read: A_{c-1} under the guard leaves A at c=0, so it may not be hoisted out of the branch
    "guarded": ("L^{10}_{c=0}[E^{f32,g}_{c}=if_then_else(1<=c<9,A^{f32,g}_{c-1}*2,0)+B^{f32,g}_{c}*3;];",
                sig(A=((8,), "input"), B=((10,), "input"), E=((10,), "output"))),
    # exp(A) repeats in nests 0-1, exp(-A) in nests 1-2: the second run starts inside the first
    "chain": ("L^{8}_{a=0}[K^{f32,g}_{a}=exp(A^{f32,g}_{a})-exp(-A^{f32,g}_{a});];"
              "L^{8}_{a=0}[M^{f32,g}_{a}=exp(A^{f32,g}_{a})+exp(-A^{f32,g}_{a});];"
              "L^{8}_{a=0}[C^{f32,g}_{a}=K^{f32,g}_{a}/M^{f32,g}_{a}*exp(-A^{f32,g}_{a});];",
              sig(A=((8,), "input"), C=((8,), "output"))),
    "cumsum": ("L^{4}_{a=0}L^{8}_{c=0}[F^{f32,g}_{a,c}=if_then_else(c-1<0,0,F^{f32,g}_{a,c-1})+A^{f32,g}_{a,c};];",
               sig(A=((4, 8), "input"), F=((4, 8), "output"))),
    # two row sums over rows c*2+d: concatenating along d would put the second half on rows c > 0 use
    "interleaved": ("L^{2}_{c=0}L^{2}_{d=0}L^{3}_{f=0}[D^{f32,g}_{c,d}=D^{f32,g}_{c,d}+A^{f32,g}_{c*2+d,f};];"
                    "L^{2}_{c=0}L^{2}_{d=0}L^{3}_{f=0}[E^{f32,g}_{c,d}=E^{f32,g}_{c,d}+C^{f32,g}_{c*2+d,f};];",
                    sig(A=((4, 3), "input"), C=((4, 3), "input"), D=((2, 2), "output"), E=((2, 2), "output"))),
}


def hand(name: str) -> Program:
    text, signature = HAND[name]
    return Program.parse(text, signature)


@pytest.fixture(scope="module")
def programs() -> dict[str, Program]:
    found = {name: hand(name) for name in HAND}
    try:
        from steptp_env.workloads import get_workload
    except ImportError:  # the suite is optional here; the hand-written programs cover every strategy
        return found
    for uri in WORKLOADS:
        found[uri] = get_workload(uri, preset="tiny").program
    return found


def spread(items: list, count: int) -> list:
    """At most `count` items spread evenly over the list (deterministic)."""
    return items[::max(1, len(items) // count)][:count]


# -- (a) candidates apply and verify --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", GRAPH)
def test_candidates_apply_and_verify(programs, strategy):
    """Up to two candidates per hand-written program and one per suite workload (verifying takes a build)."""
    st = REGISTRY[strategy]
    checked = 0
    for name, program in programs.items():
        for action in spread(st.candidates(program, "llvm"), 2 if name in HAND else 1):
            after = st.apply(program, action)
            report = verify(after, program, trials=1)
            assert report.equivalent, (name, action.text, report.reason)
            assert st.explain(program, action, after)
            checked += 1
    assert checked, f"{strategy} found no site on the test programs"


def test_dead_write_beside_a_live_one(programs):
    """TVM's storage rewrite let the dead F share G's memory; the build turns buffer sharing off here."""
    fused = apply_action(programs["dead"], "operator_fusion(nest=0, scope=g)")
    assert fused.leir.startswith("L^{4}_{a=0}L^{4}_{c=0}[F^{f32,g}_{a,c}=A^{f32,g}_{a,c}*3;G^{f32,g}_{c,a}=")
    assert verify(fused, programs["dead"], trials=1).equivalent


def test_every_candidate_applies(programs):
    """Cheaper than verifying all: every candidate of every strategy applies to a valid program."""
    for program in programs.values():
        for strategy in GRAPH:
            for action in REGISTRY[strategy].candidates(program, "cuda"):
                assert REGISTRY[strategy].apply(program, action).leir


def test_forms(programs):
    fused = apply_action(programs["sinhcosh"], "operator_fusion(nest=1, scope=s)")
    assert fused.leir.startswith("L^{4}_{a=0}L^{8}_{c=0}[K^{f32,g}")
    assert "M^{f32,s}_{a,c}=exp(A" in fused.leir and "C^{f32,g}_{a,c}=K^{f32,g}_{a,c}/M^{f32,s}_{a,c}" in fused.leir
    split = apply_action(fused, "operator_fission(nest=1, at=1)")
    assert split.leir == programs["sinhcosh"].leir  # fission undoes the fusion, storage back in global memory

    inlined = apply_action(programs["dead"], "compute_inline(nest=1, consumer=2)")
    assert "C^{f32,g}_{a,c}=(A^{f32,g}_{c,a}+1)*2" in inlined.leir  # G_{a,c} holds A_{c,a}+1
    assert "G^{" not in inlined.leir

    cse = apply_action(programs["sinhcosh"], "common_subexpression_elimination(nests=[0])")
    assert cse.leir.startswith("L^{4}_{a=0}L^{8}_{c=0}[D^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c});];")
    assert cse.leir.count("exp(A^{f32,g}_{a,c})") == 1

    concat = apply_action(programs["twins"], "tensor_concat_to_fuse_operators(nest=0, loop=a, tensors=[A])")
    assert "L^{10}_{a=0}L^{8}_{c=0}" in concat.leir and "_{a+4,c}=C^{f32,g}_{a,c}" in concat.leir
    # along c the second half of the rows c*2+d starts at row 4, past the first: legal, and it verifies
    rows = apply_action(programs["interleaved"], "tensor_concat_to_fuse_operators(nest=0, loop=c, tensors=[A])")
    assert verify(rows, programs["interleaved"], trials=2).equivalent

    matmul = apply_action(programs["matmul"], "tensor_split_to_decouple_operators(nest=0, loop=d, at=5, tensors=[A,C])")
    assert len(matmul.nests) == 5 and "L^{11}_{d=0}" in matmul.leir
    assert matmul.leir.endswith("L^{8}_{a=0}L^{12}_{c=0}"
                                "[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+(I^{f32,g}_{a,c}+J^{f32,g}_{a,c});];")


def test_fusion_under_the_row_loop(programs):
    """Passes over the same rows with different inner loops merge under the row loop (the classic form needs
    identical loops, and the row maximum D is reused along c); the second nest's inner c is renamed apart.
    Fused again, the third nest reads D at the mirrored row 3-a, which another iteration writes: refused."""
    rows = programs["rows"]
    fused = apply_action(rows, "operator_fusion(nest=0, scope=g, depth=1)")
    assert fused.leir.startswith(
        "L^{4}_{a=0}[L^{8}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];"
        "L^{2}_{f=0}L^{4}_{d=0}[E^{f32,g}_{a,f*4+d}=exp(A^{f32,g}_{a,f*4+d}-D^{f32,g}_{a});];];")
    assert verify(fused, rows, trials=2).equivalent
    assert [a.text for a in REGISTRY["operator_fusion"].candidates(fused, "llvm")] == []
    with pytest.raises(IllegalActionError, match="D is not accessed at one subscript position holding a alone"):
        apply_action(fused, "operator_fusion(nest=0, scope=g, depth=1)")
    # the second pair (E at rows a on both sides) fuses too, and then the first pair, the first nest being flat
    later = apply_action(rows, "operator_fusion(nest=1, scope=g, depth=1)")
    assert verify(later, rows, trials=2).equivalent
    assert "under their common outer loops (a(4))" in REGISTRY["operator_fusion"].explain(
        rows, Action.parse("operator_fusion(nest=1, scope=g, depth=1)"), later)


def test_split_keeps_other_reduced_loops_in_the_partials():
    """The reference's stale combine loop (it adds the partial sums once per iteration of another reduced loop)
    is not reproduced: the partial results keep that loop as a subscript and the combine reduces over it."""
    program = Program.parse("L^{3}_{a=0}L^{4}_{c=0}L^{5}_{d=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c,d};];",
                            sig(A=((3, 4, 5), "input"), D=((3,), "output")))
    after = apply_action(program, "tensor_split_to_decouple_operators(nest=0, loop=d, at=2, tensors=[A])")
    assert after.leir.endswith("L^{3}_{a=0}L^{4}_{c=0}"
                               "[D^{f32,g}_{a}=D^{f32,g}_{a}+(F^{f32,g}_{a,c}+G^{f32,g}_{a,c});];")
    assert verify(after, program, trials=1).equivalent


def test_menus_respect_the_analysis(programs):
    def offered(strategy, name, target="llvm"):
        return [a.text for a in REGISTRY[strategy].candidates(programs[name], target)]

    assert offered("operator_fusion", "twins") == []  # different extents
    assert offered("operator_fusion", "rows") == ["operator_fusion(nest=0, scope=g, depth=1)",  # D reused along c
                                                 "operator_fusion(nest=1, scope=g, depth=1)"]  # inner loops differ
    assert offered("operator_fusion", "dead") == ["operator_fusion(nest=0, scope=g)"]  # G is read transposed
    assert offered("operator_fusion", "sinhcosh", "cuda")[-2:] == ["operator_fusion(nest=1, scope=s)",
                                                                   "operator_fusion(nest=1, scope=l)"]
    assert offered("operator_fission", "fused") == ["operator_fission(nest=0, at=1)"]  # not the running sums
    assert offered("dead_code_elimination", "dead") == ["dead_code_elimination(nest=0)"]
    assert offered("expression_reorder", "twins") == ["expression_reorder(nest=0)"]
    assert offered("tensor_split_to_decouple_operators", "cumsum") == []  # a scan reads its own target
    assert all("term=[0,1,0]" not in t for t in offered("expression_splitting", "guarded"))  # A_{c-1}*2
    assert offered("common_subexpression_elimination", "sinhcosh") == ["common_subexpression_elimination(nests=[0])"]


# -- (b) illegal actions ------------------------------------------------------------------------------------------

ILLEGAL = [
    ("sinhcosh", "operator_fusion(nest=7, scope=g)", "no nest 7"),
    ("sinhcosh", "operator_fusion(nest=2, scope=g)", "last nest"),
    ("twins", "operator_fusion(nest=0, scope=g)", "different loops"),
    ("dead", "operator_fusion(nest=1, scope=g)", "different elements"),
    ("sinhcosh", "operator_fusion(nest=0, scope=x)", "scope must be"),
    ("sinhcosh", "operator_fusion(nest=0)", "takes parameters"),
    ("rows", "operator_fusion(nest=0, scope=g, depth=2)", "outer 2 loops differ"),
    ("rows", "operator_fusion(nest=0, scope=g, depth=0)", "depth must be between 1 and 2"),
    ("rows", "operator_fusion(nest=0, scope=g, depth=true)", "depth must be"),
    ("sinhcosh", "operator_fusion(nest=0, scope=g, depth=2)", "without a depth"),
    ("rows", "operator_fusion(nest=2, scope=g, depth=1)", "last nest"),
    ("fused", "operator_fission(nest=1, at=1)", "reused across iterations"),
    ("fused", "operator_fission(nest=0, at=2)", "at must be"),
    ("matmul", "operator_fission(nest=0, at=1)", "single equation"),
    ("matmul", "compute_inline(nest=0, consumer=1)", "signature tensor"),
    ("sinhcosh", "compute_inline(nest=0, consumer=1)", "does not read"),
    ("sinhcosh", "compute_inline(nest=1, consumer=0)", "later nest"),
    ("fused", "compute_inline(nest=1, consumer=1)", "equations"),
    ("sinhcosh", "expression_splitting(nest=0, term=[0,0,0], dims=[a,c], loops=[a,c])", "single leaf"),
    ("sinhcosh", "expression_splitting(nest=0, term=[0,5], dims=[a,c], loops=[a,c])", "not a value"),
    ("sinhcosh", "expression_splitting(nest=0, term=[0,0], dims=[a], loops=[a,c])", "dims must list"),
    ("guarded", "expression_splitting(nest=0, term=[0,0,1], dims=[c], loops=[c])", "outside a tensor"),
    ("matmul", "expression_splitting(nest=0, term=[0], dims=[a,c,d], loops=[a,c,d])", "writes"),
    ("sinhcosh", "tensor_concat_to_fuse_operators(nest=0, loop=a, tensors=[A])", "same operator"),
    ("sinhcosh", "tensor_concat_to_fuse_operators(nest=1, loop=a, tensors=[A])", "depend on each other"),
    ("twins", "tensor_concat_to_fuse_operators(nest=0, loop=z, tensors=[A])", "no loop"),
    ("twins", "tensor_concat_to_fuse_operators(nest=0, loop=a, tensors=[C])", "tensors must order"),
    ("interleaved", "tensor_concat_to_fuse_operators(nest=0, loop=d, tensors=[A])", "would overwrite"),
    ("matmul", "tensor_split_to_decouple_operators(nest=0, loop=d, at=16, tensors=[A])", "strictly inside"),
    ("matmul", "tensor_split_to_decouple_operators(nest=0, loop=x, at=2, tensors=[A])", "no loop"),
    ("matmul", "tensor_split_to_decouple_operators(nest=0, loop=a, at=2, tensors=[C])", "cannot be copied"),
    ("cumsum", "tensor_split_to_decouple_operators(nest=0, loop=c, at=2, tensors=[])", "outside a reduction"),
    ("matmul", "common_subexpression_elimination(nests=[0])", "no repeated"),
    ("sinhcosh", "common_subexpression_elimination(nests=[1])", "no repeated"),
    ("chain", "common_subexpression_elimination(nests=[0,1])", "inside the run"),
    ("sinhcosh", "common_subexpression_elimination(nests=3)", "list of nest indices"),
    ("dead", "dead_code_elimination(nest=1)", "read by nest 2"),
    ("dead", "dead_code_elimination(nest=2)", "signature tensor"),
    ("sinhcosh", "expression_reorder(nest=1)", "reads what nest 1 writes"),
    ("sinhcosh", "expression_reorder(nest=2)", "last nest"),
]


@pytest.mark.parametrize("name,text,reason", ILLEGAL)
def test_illegal_actions_are_refused_with_a_reason(programs, name, text, reason):
    with pytest.raises(IllegalActionError, match=reason):
        apply_action(programs[name], text)


def test_reorder_of_disjoint_writes():
    program = Program.parse("L^{4}_{a=0}[D^{f32,g}_{0,a}=A^{f32,g}_{a};];L^{4}_{a=0}[D^{f32,g}_{1,a}=A^{f32,g}_{a}*2;];"
                            "L^{4}_{a=0}[D^{f32,g}_{a%2,a}=A^{f32,g}_{a}*3;];",
                            sig(A=((4,), "input"), D=((2, 4), "output")))
    assert [a.text for a in REGISTRY["expression_reorder"].candidates(program)] == ["expression_reorder(nest=0)"]


# -- (c) action text round trip, (e) determinism --------------------------------------------------------------


@pytest.mark.parametrize("strategy", GRAPH)
def test_action_text_round_trip_and_determinism(programs, strategy):
    st = REGISTRY[strategy]
    for program in programs.values():
        for target in ("llvm", "cuda"):
            first = st.candidates(program, target)
            assert first == st.candidates(program, target)
            for action in first:
                assert Action.parse(action.text) == action
                assert tuple(k for k, _ in action.params) in (st.params, st.alternative_params)


# -- (d) identify on reference rows -------------------------------------------------------------------------------

def _reference_bug(strategy: str, original: Program, transformed: Program) -> bool:
    """Rows whose transformed program carries a known reference bug that the strategy does not reproduce."""
    outputs = {t.name for t in original.signature.outputs}
    if strategy == "operator_fusion":  # an output placed in shared or local memory
        return any(eq.lhs.name in outputs and eq.lhs.scope != "g" for n in transformed.nests for _, eq in equations(n))
    if strategy == "tensor_split_to_decouple_operators":  # the combine nest keeps a stale reduction loop
        return drop_stale_combine_loops(transformed) is not None
    if strategy == "tensor_concat_to_fuse_operators":  # block-diagonal concatenation (reads unwritten elements)
        grown = [a.extent != b.extent for a, b in zip(original.nests[0].loops, transformed.nests[2].loops)]
        return sum(grown) > 1
    return False


@pytest.mark.parametrize("strategy", GRAPH)
def test_identify_recognises_reference_rows(strategy, ref_programs, ref_transitions):
    signatures = {row["id"]: row["signature"] for row in ref_programs}
    rows = [t for t in ref_transitions if t["strategy"] == strategy
            and (t["original_is_input_leir"] or strategy == "dead_code_elimination")
            and len(t["original_leir"]) <= MAX_SAMPLE_CHARS]
    rows.sort(key=lambda t: (len(t["original_leir"]), t["program"], t["transformed_leir"]))
    pairs = [(Program.parse(t["original_leir"], signatures[t["program"]]),
              Program.parse(t["transformed_leir"], signatures[t["program"]])) for t in rows]
    buggy = [p for p in pairs if _reference_bug(strategy, *p)]
    sample = spread([p for p in pairs if p not in buggy], IDENTIFY_SAMPLE)
    found = sum(any(a.strategy == strategy for a in identify(*pair)) for pair in sample)
    print(f"{strategy}: identify found {found}/{len(sample)} sampled reference rows")
    assert sample and found / len(sample) >= 0.9
    for original, transformed in buggy[:1]:  # the reference's bugs are not reproduced
        assert not [a for a in REGISTRY[strategy].candidates(original, "cuda")
                    if REGISTRY[strategy].apply(original, a).leir == transformed.leir]
