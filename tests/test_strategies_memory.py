"""The memory strategies: reduction_factorization, cache_read_write, layout_transformation, set_storage_scope,
set_storage_layout, precompute_indices.

Every candidate on small suite workloads and hand-written programs applies and verifies equivalent; every
illegal action is refused with a reason; actions round-trip through their text; candidates are
deterministic; and `identify` recognises the reference corpus's rows of these strategies.
"""
from __future__ import annotations

import pytest

from steptp_env import Program, verify
from steptp_env.errors import IllegalActionError
from steptp_env.ir.ast import accesses, free_vars
from steptp_env.strategies import REGISTRY, Action, apply_action, canonical_text, identify
from steptp_env.workloads import get_workload

MEMORY = ("reduction_factorization", "cache_read_write", "layout_transformation", "set_storage_scope",
          "set_storage_layout", "precompute_indices")
WORKLOADS = ("level1/softmax", "level1/matmul_square", "level1/max_pool_1d", "level1/layer_norm",
             "level2/gemm_relu_divide", "level1/conv2d_square_input_square_kernel")
VERIFIED = 30
"""Candidates per strategy that the test runs and compares (all of them are applied)."""
IDENTIFY_SAMPLE = 6
"""Reference rows per strategy checked with the full `identify` (all strategies) in the test."""
MAX_SAMPLE_CHARS = 1200


def _program(text: str, *specs: tuple[str, tuple[int, ...], str]) -> Program:
    return Program.parse(text, [{"name": n, "shape": list(s), "dtype": "float64", "role": r} for n, s, r in specs])


# Hand-written programs covering what the suite lacks: inner nests (a cache of a tensor written twice at
# the same subscripts), sibling inner nests reusing a variable name, a scalar reduction over several loops,
# a reduction into a tensor written before, a guarded (padded) read, and a product and a min reduction.
INNER = _program("L^{2}_{c=0}[D^{f64,g}_{c}=0;L^{3}_{d=0}[D^{f64,g}_{c}=D^{f64,g}_{c}+A^{f64,g}_{c,d};];];",
                 ("A", (2, 3), "input"), ("D", (2,), "output"))
SIBLINGS = _program("L^{4}_{c=0}[L^{3}_{d=0}[E^{f64,g}_{c,d}=A^{f64,g}_{c,d*2+1};];"
                    "L^{5}_{d=0}[F^{f64,g}_{c,d}=A^{f64,g}_{c,d*2+1}*2;];];"
                    "L^{4}_{c=0}L^{3}_{d=0}[D^{f64,g}_{c,d}=E^{f64,g}_{c,d}+F^{f64,g}_{c,d+2};];",
                    ("A", (4, 11), "input"), ("D", (4, 3), "output"))
SCALAR = _program("L^{4}_{a=0}L^{6}_{c=0}L^{5}_{d=0}[E^{f64,g}=E^{f64,g}+A^{f64,g}_{a,c,d}**2;];"
                  "L^{1}_{a=0}[D^{f64,g}_{a}=E^{f64,g};];",
                  ("A", (4, 6, 5), "input"), ("D", (1,), "output"))
UPDATED = _program("L^{3}_{a=0}[D^{f64,g}_{a}=A^{f64,g}_{a,0};];"
                   "L^{3}_{a=0}L^{8}_{c=0}[D^{f64,g}_{a}=min(D^{f64,g}_{a},A^{f64,g}_{a,c});];"
                   "L^{3}_{a=0}L^{8}_{c=0}[G^{f64,g}_{a}=G^{f64,g}_{a}*A^{f64,g}_{a,c};];"
                   "L^{3}_{a=0}[C^{f64,g}_{a}=D^{f64,g}_{a}+G^{f64,g}_{a};];",
                   ("A", (3, 8), "input"), ("C", (3,), "output"), ("D", (3,), "output"))
PADDED = _program("L^{2}_{a=0}L^{12}_{c=0}[E^{f64,g}_{a,c}=if_then_else(2<=c<10,A^{f64,g}_{a,c-2},0);];"
                  "L^{2}_{a=0}L^{5}_{c=0}L^{3}_{d=0}[D^{f64,g}_{a,c}=D^{f64,g}_{a,c}+E^{f64,g}_{a,c*2+d}"
                  "*C^{f64,g}_{d};];",
                  ("A", (2, 8), "input"), ("C", (3,), "input"), ("D", (2, 5), "output"))
OFFSET = _program("L^{4}_{a=0}L^{3}_{c=0}[D^{f64,g}_{a,c}=A^{f64,g}_{a,c+1};];",
                  ("A", (4, 4), "input"), ("D", (4, 3), "output"))
HANDWRITTEN = {"inner": INNER, "siblings": SIBLINGS, "scalar": SCALAR, "updated": UPDATED, "padded": PADDED}


@pytest.fixture(scope="module")
def programs() -> dict[str, object]:
    """Name -> what verify compares with: a suite workload, or the hand-written program itself."""
    found: dict[str, object] = {name: get_workload(name, preset="tiny") for name in WORKLOADS}
    found.update(HANDWRITTEN)
    return found


def _prog(subject) -> Program:
    return subject if isinstance(subject, Program) else subject.program


# -- (a) every candidate applies and is equivalent ------------------------------------------------------------


@pytest.mark.parametrize("name", MEMORY)
def test_candidates_apply_and_verify(name, programs):
    """Every candidate (both targets) applies to a valid program and explains itself; an evenly spread,
    fixed subset of at most VERIFIED per strategy is also run and compared numerically."""
    strategy = REGISTRY[name]
    applied = []
    for label, subject in programs.items():
        program = _prog(subject)
        actions = strategy.candidates(program, "llvm")
        actions += [a for a in strategy.candidates(program, "cuda") if a not in actions]
        for action in actions:
            after = strategy.apply(program, action)
            assert strategy.explain(program, action, after)
            applied.append((label, subject, action, after))
    assert len(applied) >= 6, f"{name}: only {len(applied)} candidates on the test programs"
    for label, subject, action, after in applied[::-(-len(applied) // VERIFIED)]:
        report = verify(after, subject, trials=1)
        assert report.equivalent, (label, action.text, report.reason, after.leir)


def test_every_strategy_has_sites_on_the_test_programs(programs):
    for name in MEMORY:
        sites = {label for label, s in programs.items() if REGISTRY[name].candidates(_prog(s), "cuda")}
        assert len(sites) >= 3, (name, sites)


# -- (c) text round trip and (e) determinism --------------------------------------------------------------------


@pytest.mark.parametrize("name", MEMORY)
def test_action_text_round_trip_and_determinism(name, programs):
    strategy = REGISTRY[name]
    for subject in programs.values():
        program = _prog(subject)
        for target in ("llvm", "cuda"):
            first = strategy.candidates(program, target)
            assert first == strategy.candidates(Program.parse(program.leir, program.signature), target)
            for action in first:
                assert Action.parse(action.text) == action
                assert canonical_text(apply_action(program, action.text)) == \
                    canonical_text(strategy.apply(program, action))


# -- the reference's forms ------------------------------------------------------------------------------------


def _same(after: Program, text: str) -> None:
    assert canonical_text(after) == canonical_text(Program.parse(text, after.signature)), after.leir


def test_reduction_factorization_form_and_initialisation(programs):
    matmul = programs["level1/matmul_square"].program
    after = apply_action(matmul, "reduction_factorization(nest=0, loop=d, split=20)")
    _same(after, "L^{32}_{a=0}L^{32}_{c=0}L^{20}_{d=0}[E^{f32,g}_{a,c}=E^{f32,g}_{a,c}+A^{f32,g}_{a,d}"
                 "*C^{f32,g}_{d,c};];L^{32}_{a=0}L^{32}_{c=0}L^{12}_{d=0}[F^{f32,g}_{a,c}=F^{f32,g}_{a,c}"
                 "+A^{f32,g}_{a,d+20}*C^{f32,g}_{d+20,c};];"
                 "L^{32}_{a=0}L^{32}_{c=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+(E^{f32,g}_{a,c}+F^{f32,g}_{a,c});];")
    # several reduced loops: the combine runs only the target's loops (the reference re-adds the partials)
    conv = programs["level1/conv2d_square_input_square_kernel"].program
    after = apply_action(conv, "reduction_factorization(nest=0, loop=h, split=2)")
    assert [l.var for l in after.nests[2].loops] == ["a", "c", "d", "f"]
    # a scalar target keeps one partial per other loop iteration and the combine sums them
    after = apply_action(SCALAR, "reduction_factorization(nest=0, loop=c, split=4)")
    assert after.nests[0].body[0].lhs.rank == 2 and [l.var for l in after.nests[2].loops] == ["a", "d"]
    # a target written by an earlier nest is assigned by the combine, not accumulated into
    after = apply_action(UPDATED, "reduction_factorization(nest=1, loop=c, split=3)")
    combine = after.nests[3].body[0]
    assert combine.lhs.name == "D" and combine.lhs not in list(accesses(combine.rhs))
    assert verify(after, UPDATED).equivalent


def test_cache_and_layout_forms():
    gpu = _program("B^{16}_{tx=0}L^{64}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];",
                   ("A", (16, 64), "input"), ("D", (16,), "output"))
    after = apply_action(gpu, "cache_read_write(nest=0, tensor=D, mode=write, scope=l)")
    _same(after, "B^{16}_{tx=0}L^{64}_{a=0}[E^{f64,l}_{tx}=max(E^{f64,l}_{tx},A^{f64,g}_{tx,a});];"
                 "B^{16}_{tx=0}[D^{f64,g}_{tx}=E^{f64,l}_{tx};];")
    after = apply_action(gpu, "layout_transformation(nest=0, tensor=A, layout=[[0,div,8],[0,mod,8],1])")
    _same(after, "L^{2}_{f=0}B^{8}_{tx=0}L^{64}_{a=0}[E^{f64,g}_{f,tx,a}=A^{f64,g}_{f*8+tx,a};];"
                 "B^{16}_{tx=0}L^{64}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},E^{f64,g}_{tx//8,tx%8,a});];")
    matvec = _program("B^{16}_{tx=0}L^{8}_{a=0}L^{32}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}"
                      "*C^{f64,g}_{c,a};];", ("A", (16, 32), "input"), ("C", (32, 8), "input"),
                      ("D", (16, 8), "output"))
    after = apply_action(matvec, "cache_read_write(nest=0, tensor=C, mode=read, scope=s)")
    _same(after, "B^{8}_{tx=0}L^{32}_{c=0}[E^{f64,s}_{c,tx}=C^{f64,g}_{c,tx};];B^{16}_{tx=0}L^{8}_{a=0}L^{32}_{c=0}"
                 "[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*E^{f64,s}_{c,a};];")
    assert verify(after, matvec).equivalent


def test_blocked_layouts_make_the_innermost_dimension_vector_lanes():
    """The dimension the innermost loop walks becomes blocks of 16 lanes: packed (a GEMM's weights, each
    column block contiguous) and in place (NCHWc-like, for a dimension that is not the last)."""
    matmul = _program("L^{4}_{a=0}L^{6}_{d=0}L^{32}_{c=0}[D^{f64,g}_{a,c}=D^{f64,g}_{a,c}+A^{f64,g}_{a,d}"
                      "*C^{f64,g}_{d,c};];", ("A", (4, 6), "input"), ("C", (6, 32), "input"),
                      ("D", (4, 32), "output"))
    menu = [a["layout"] for a in REGISTRY["layout_transformation"].candidates(matmul, "llvm") if a["tensor"] == "C"]
    assert ((1, "div", 16), 0, (1, "mod", 16)) in menu
    assert (0, (1, "div", 16), (1, "mod", 16)) not in menu  # the same memory order as C: not offered
    after = apply_action(matmul, "layout_transformation(nest=0, tensor=C, layout=[[1,div,16],0,[1,mod,16]])")
    assert "E^{f64,g}_{c//16,d,c%16}" in after.leir and verify(after, matmul).equivalent
    channels = _program("L^{2}_{a=0}L^{3}_{d=0}L^{32}_{c=0}[D^{f64,g}_{a,c}=D^{f64,g}_{a,c}+A^{f64,g}_{a,c,d};];",
                        ("A", (2, 32, 3), "input"), ("D", (2, 32), "output"))
    menu = [a["layout"] for a in REGISTRY["layout_transformation"].candidates(channels, "llvm")]
    assert (0, (1, "div", 16), 2, (1, "mod", 16)) in menu and ((1, "div", 16), 0, 2, (1, "mod", 16)) in menu
    after = apply_action(channels, "layout_transformation(nest=0, tensor=A, layout=[0,[1,div,16],2,[1,mod,16]])")
    assert "^{f64,g}_{a,c//16,d,c%16}" in after.leir and verify(after, channels).equivalent


def test_storage_and_index_forms():
    after = apply_action(PADDED, "set_storage_layout(tensor=E, layout=[[1,0]])")
    assert "E^{f64,g}_{(c*2+d)*2+a}" in after.leir and verify(after, PADDED).equivalent
    after = apply_action(PADDED, "set_storage_scope(tensor=E, scope=l)")
    assert "E^{f64,g}" not in after.leir and after.tensors["E"].scope == "l"
    after = apply_action(PADDED, "precompute_indices(nest=0, tensor=A, dim=1)")
    _same(after, "L^{12}_{c=0}[F^{i64,g}_{c}=c-2;];L^{2}_{a=0}L^{12}_{c=0}[E^{f64,g}_{a,c}=if_then_else(2<=c<10,"
                 "A^{f64,g}_{a,F^{i64,g}_{c}},0);];" + PADDED.leir.split(";];", 1)[1])
    assert verify(after, PADDED).equivalent


def test_siblings_reusing_a_variable_keep_their_own_extents():
    after = apply_action(SIBLINGS, "precompute_indices(nest=0, tensor=A, dim=1)")
    # only the first inner nest (d over 3) reads the index tensor; the second (d over 5) keeps d*2+1
    assert "A^{f64,g}_{c,d*2+1}*2" in after.leir and verify(after, SIBLINGS).equivalent
    after = apply_action(SIBLINGS, "cache_read_write(nest=0, tensor=A, mode=read, scope=l)")
    assert verify(after, SIBLINGS).equivalent


def test_local_limit_matches_the_lowering():
    from steptp_env.lower.tir import LOCAL_SCOPE_LIMIT_BYTES
    from steptp_env.strategies import memory

    assert memory.LOCAL_SCOPE_LIMIT_BYTES == LOCAL_SCOPE_LIMIT_BYTES


def test_scopes_on_each_target(programs):
    matmul = programs["level1/matmul_square"].program  # no intermediate: nothing to move
    assert REGISTRY["set_storage_scope"].candidates(matmul, "cuda") == []
    scopes = {a["scope"] for a in REGISTRY["set_storage_scope"].candidates(PADDED, "llvm")}
    assert scopes == {"l"}
    assert {a["scope"] for a in REGISTRY["set_storage_scope"].candidates(PADDED, "cuda")} == {"l", "s"}
    assert {a["scope"] for a in REGISTRY["cache_read_write"].candidates(PADDED, "llvm")} == {"l"}
    assert {a["scope"] for a in REGISTRY["cache_read_write"].candidates(PADDED, "cuda")} == {"s"}


# -- (b) illegal actions --------------------------------------------------------------------------------------


ILLEGAL = [
    # reduction_factorization
    (PADDED, "reduction_factorization(nest=7, loop=d, split=1)", "no nest 7"),
    (PADDED, "reduction_factorization(nest=1, loop=z, split=1)", "no loop 'z'"),
    (PADDED, "reduction_factorization(nest=1, loop=c, split=1)", "not reduced"),
    (PADDED, "reduction_factorization(nest=1, loop=d, split=3)", "split must be"),
    (PADDED, "reduction_factorization(nest=0, loop=c, split=3)", "not a single reduction"),
    (INNER, "reduction_factorization(nest=0, loop=d, split=1)", "not a single reduction"),
    (PADDED, "reduction_factorization(nest=1, loop=d)", "takes parameters"),
    # cache_read_write
    (PADDED, "cache_read_write(nest=3, tensor=A, mode=read, scope=l)", "no nest 3"),
    (PADDED, "cache_read_write(nest=0, tensor=Q, mode=read, scope=l)", "no tensor"),
    (PADDED, "cache_read_write(nest=0, tensor=A, mode=read, scope=l)", "reach outside"),
    (PADDED, "cache_read_write(nest=1, tensor=D, mode=read, scope=l)", "writes D"),
    (PADDED, "cache_read_write(nest=1, tensor=C, mode=write, scope=l)", "does not write"),
    (UPDATED, "cache_read_write(nest=1, tensor=D, mode=write, scope=l)", "written before"),
    (PADDED, "cache_read_write(nest=1, tensor=C, mode=copy, scope=l)", "mode must be"),
    (PADDED, "cache_read_write(nest=1, tensor=C, mode=read, scope=x)", "scope must be"),
    # layout_transformation
    (PADDED, "layout_transformation(nest=5, tensor=E, layout=[1,0])", "no nest 5"),
    (PADDED, "layout_transformation(nest=1, tensor=Q, layout=[1,0])", "no tensor"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[[0,div,3],[0,mod,3],1])", "does not divide"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[0,1])", "current one"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[0,0])", "exactly once"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[0,[1,div,2]])", "div and one mod"),
    (OFFSET, "layout_transformation(nest=0, tensor=A, layout=[0,[1,div,2],[1,mod,2]])", "plain loop variable"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[0,x])", "a dimension or a list"),
    (PADDED, "layout_transformation(nest=1, tensor=E, layout=[0,[1,x]])", "neither"),
    (PADDED, "layout_transformation(nest=1, tensor=C, layout=[0,2])", "outside"),
    (PADDED, "layout_transformation(nest=0, tensor=E, layout=[1,0])", "writes E"),
    # set_storage_scope
    (PADDED, "set_storage_scope(tensor=A, scope=l)", "in the signature"),
    (PADDED, "set_storage_scope(tensor=Q, scope=l)", "no tensor"),
    (PADDED, "set_storage_scope(tensor=E, scope=g)", "already"),
    (PADDED, "set_storage_scope(tensor=E, scope=q)", "scope must be"),
    (PADDED, "set_storage_scope(tensor=E)", "takes parameters"),
    # set_storage_layout
    (PADDED, "set_storage_layout(tensor=D, layout=[1,0])", "in the signature"),
    (PADDED, "set_storage_layout(tensor=Q, layout=[1,0])", "no tensor"),
    (PADDED, "set_storage_layout(tensor=E, layout=[[0,div,3],[0,mod,3],1])", "does not divide"),
    (SCALAR, "set_storage_layout(tensor=E, layout=[0])", "scalar"),
    (PADDED, "set_storage_layout(tensor=E, layout=7)", "non-empty list"),
    # precompute_indices
    (PADDED, "precompute_indices(nest=9, tensor=A, dim=1)", "no nest 9"),
    (PADDED, "precompute_indices(nest=0, tensor=Q, dim=1)", "does not access"),
    (PADDED, "precompute_indices(nest=0, tensor=A, dim=0)", "non-trivial"),
    (PADDED, "precompute_indices(nest=0, tensor=A, dim=5)", "non-trivial"),
    (PADDED, "precompute_indices(nest=0, tensor=A, axis=1)", "takes parameters"),
]


@pytest.mark.parametrize("program,text,reason", ILLEGAL, ids=[t for _, t, _ in ILLEGAL])
def test_illegal_actions_are_refused_with_a_reason(program, text, reason):
    with pytest.raises(IllegalActionError, match=reason):
        apply_action(program, text)


def test_scan_is_not_relaid_out():
    scan = _program("L^{4}_{a=0}L^{6}_{c=0}[E^{f64,g}_{a,c}=if_then_else(c-1<0,0,E^{f64,g}_{a,c-1})+A^{f64,g}_{a,c};];"
                    "L^{4}_{a=0}L^{6}_{c=0}[D^{f64,g}_{a,c}=E^{f64,g}_{a,c};];",
                    ("A", (4, 6), "input"), ("D", (4, 6), "output"))
    assert REGISTRY["set_storage_layout"].candidates(scan) == []
    with pytest.raises(IllegalActionError, match="prefix scan"):
        apply_action(scan, "set_storage_layout(tensor=E, layout=[1,0])")


def test_stored_in_the_order_its_loops_write_it():
    """A local accumulator whose vector loop walks its channels (not its last dimension) is offered the
    layout its writing loops walk, after the fixed layout menus, and stays equivalent."""
    tile = _program("L^{2}_{a=0}L^{3}_{b=0}[L^{4}_{d=0}L^{8}_{c=0}"
                    "[F^{f64,l}_{a,c,b}=F^{f64,l}_{a,c,b}+A^{f64,g}_{a,b,d}*C^{f64,g}_{d,c};];"
                    "L^{8}_{c=0}[D^{f64,g}_{a,c,b}=F^{f64,l}_{a,c,b};];];",
                    ("A", (2, 3, 4), "input"), ("C", (4, 8), "input"), ("D", (2, 8, 3), "output"))
    menu = [a.text for a in REGISTRY["set_storage_layout"].candidates(tile)]
    assert menu[-1] == "set_storage_layout(tensor=F, layout=[0,2,1])"
    assert menu.count(menu[-1]) == 1
    after = apply_action(tile, menu[-1])
    assert "F^{f64,l}_{a,b,c}" in after.leir
    assert verify(after, tile, trials=1).equivalent


# -- (d) identify on the reference corpus ------------------------------------------------------------------


def _rows(ref_transitions, name):
    return [t for t in ref_transitions if t["strategy"] == name and t["original_is_input_leir"]]


def _readds_partials(original: Program, transformed: Program) -> bool:
    """The reference's reduction_factorization bug: on a non-scalar target with several reduced loops its
    combine nest keeps the other reduced loops and adds the partials once per iteration of them."""
    n = next(i for i, (a, b) in enumerate(zip(original.nests, transformed.nests)) if a != b)
    target = original.nests[n].body[0].lhs
    combine = transformed.nests[n + 2]
    used = {v for i in target.indices for v in free_vars(i)}
    return bool(target.indices) and any(l.var not in used for l in combine.loops)


def _sample(rows: list[dict], count: int) -> list[dict]:
    """`count` rows spread evenly over the rows of programs up to MAX_SAMPLE_CHARS characters, ordered by
    size (a fixed sample that keeps `identify`, which tries every strategy, fast)."""
    rows = sorted((t for t in rows if len(t["original_leir"]) <= MAX_SAMPLE_CHARS),
                  key=lambda t: (len(t["original_leir"]), t["program"], t["transformed_leir"]))
    return rows[::max(1, len(rows) // count)][:count]


@pytest.mark.parametrize("name", MEMORY)
def test_identify_recognises_reference_rows(name, ref_programs, ref_transitions):
    signatures = {row["id"]: row["signature"] for row in ref_programs}
    pairs = [(Program.parse(t["original_leir"], signatures[t["program"]]),
              Program.parse(t["transformed_leir"], signatures[t["program"]]))
             for t in _sample(_rows(ref_transitions, name), 2 * IDENTIFY_SAMPLE)]
    buggy = [p for p in pairs if name == "reduction_factorization" and _readds_partials(*p)]
    sample = [p for p in pairs if p not in buggy][:IDENTIFY_SAMPLE]
    found = sum(any(a.strategy == name for a in identify(*pair)) for pair in sample)
    print(f"{name}: identify found {found}/{len(sample)} sampled reference rows")
    assert len(sample) == IDENTIFY_SAMPLE and found / len(sample) >= 0.9
    for original, transformed in buggy[:2]:  # the reference's re-added partials are not reproduced
        assert not [a for a in identify(original, transformed) if a.strategy == name]
