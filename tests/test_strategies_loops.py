"""The loop strategies: legal candidates verify, illegal actions are refused with a reason, actions round
trip through their text, reference transitions are identified, and menus are deterministic."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from steptp_env import build, verify
from steptp_env.errors import IllegalActionError
from steptp_env.ir.program import Program
from steptp_env.strategies import Action, REGISTRY, apply_action, identify
from steptp_env.strategies.loop_deps import band_dependences

LOOP_STRATEGIES = ("loop_reorder", "loop_tiling", "loop_split", "loop_fusion", "loop_unrolling",
                   "loop_parallelization", "loop_vectorization", "loop_binding")
REF = Path("/work/shared/steptp-ref")


def sig(**tensors) -> list[dict]:
    return [{"name": n, "shape": list(shape), "dtype": "float32", "role": role}
            for n, (shape, role) in tensors.items()]


HAND = {
    "matmul": ("L^{8}_{a=0}L^{12}_{c=0}L^{16}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}*C^{f32,g}_{d,c};];",
               sig(A=((8, 16), "input"), C=((16, 12), "input"), D=((8, 12), "output"))),
    "small": ("L^{8}_{a=0}L^{4}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];",
              sig(A=((8, 4), "input"), C=((8, 4), "output"))),
    "inner": ("L^{4}_{c=0}[D^{f32,g}_{c}=0;L^{8}_{d=0}[D^{f32,g}_{c}=D^{f32,g}_{c}+A^{f32,g}_{c,d};];"
              "E^{f32,g}_{c}=D^{f32,g}_{c}*2;];", sig(A=((4, 8), "input"), E=((4,), "output"))),
    # F_{a,c} depends on F_{a-1,c+1}: a wavefront, neither loop may move or run in parallel
    "wave": ("L^{6}_{a=0}L^{6}_{c=0}[F^{f32,g}_{a,c}=if_then_else(1<=a&c<5,F^{f32,g}_{a-1,c+1},0)+A^{f32,g}_{a,c};];",
             sig(A=((6, 6), "input"), F=((6, 6), "output"))),
    # Y reads the partial sums of X: the reduction loops c, d must keep their order
    "partial": ("L^{2}_{a=0}L^{3}_{c=0}L^{4}_{d=0}[X^{f32,g}_{a}=X^{f32,g}_{a}+A^{f32,g}_{a,c,d};"
                "Y^{f32,g}_{a,c,d}=X^{f32,g}_{a};];", sig(A=((2, 3, 4), "input"), Y=((2, 3, 4), "output"))),
    "long": ("L^{2}_{a=0}L^{1024}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,1023-c};];",
             sig(A=((2, 1024), "input"), C=((2, 1024), "output"))),
    # the scalar E is overwritten in every iteration: a is not parallel
    "scalar": ("L^{8}_{a=0}[E^{f32,g}=A^{f32,g}_{a}*2;C^{f32,g}_{a}=E^{f32,g}+1;];",
               sig(A=((8,), "input"), C=((8,), "output"))),
}
WORKLOADS = ("level1/softmax", "level1/cumsum", "level1/layer_norm", "level2/gemm_relu_divide")


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


def sample(items: list, count: int) -> list:
    """At most `count` items spread evenly over the list (deterministic)."""
    step = max(1, len(items) // count)
    return items[::step][:count]


# -- (a) candidates apply and verify --------------------------------------------------------------------


@pytest.mark.parametrize("strategy", LOOP_STRATEGIES[:-1])
def test_candidates_verify_on_cpu(programs, strategy):
    st = REGISTRY[strategy]
    offered = 0
    for name, program in programs.items():
        for action in sample(st.candidates(program, "llvm"), 3):
            after = st.apply(program, action)
            report = verify(after, program, trials=1)
            assert report.equivalent, f"{name}: {action.text} -> {after.leir}: {report.reason}"
            text = st.explain(program, action, after)
            assert f"nest {action['nest']}" in text and "Legal" in text
            offered += 1
    assert offered > 0


def test_binding_candidates_build_for_cuda(programs):
    st = REGISTRY["loop_binding"]
    assert st.candidates(programs["matmul"], "llvm") == []
    built = 0
    for name in ("matmul", "small", "inner"):
        program = programs[name]
        for action in sample(st.candidates(program, "cuda"), 2):
            after = st.apply(program, action)
            assert action["axis"] + action["loop"] in after.leir
            build(after, "cuda")
            assert "threadIdx" in st.explain(program, action, after) or "blockIdx" in st.explain(program, action, after)
            built += 1
    assert built >= 4


def test_menus_respect_the_analysis(programs):
    def texts(strategy, name, target="llvm"):
        return [a.text for a in REGISTRY[strategy].candidates(programs[name], target)]

    assert texts("loop_reorder", "wave") == [] and texts("loop_parallelization", "wave") == []
    assert texts("loop_tiling", "wave") == []
    assert texts("loop_parallelization", "scalar") == []
    assert "loop_parallelization(nest=0, loop=d)" not in texts("loop_parallelization", "matmul")
    # partial sums of X are read: c and d may not swap, a may move around them
    assert texts("loop_reorder", "partial") == ["loop_reorder(nest=0, order=[c,d,a])",
                                               "loop_reorder(nest=0, order=[c,a,d])"]
    assert texts("loop_vectorization", "small") == ["loop_vectorization(nest=0, loop=c)"]
    assert "loop_unrolling(nest=0, loop=c)" in texts("loop_unrolling", "small")
    assert texts("loop_binding", "inner", "cuda") == ["loop_binding(nest=0, loop=c, axis=bx)",
                                                      "loop_binding(nest=0, loop=c, axis=tx)"]


MATMUL_64 = ("L^{64}_{a=0}L^{64}_{c=0}L^{64}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}*C^{f32,g}_{d,c};];",
             sig(A=((64, 64), "input"), C=((64, 64), "input"), D=((64, 64), "output")))


def _verified(program: Program, texts: list[str]) -> None:
    for text in texts:
        after = apply_action(program, text)
        report = verify(after, program, trials=1)
        assert report.equivalent, f"{text} -> {after.leir}: {report.reason}"


def test_tiling_offers_independent_factor_pairs():
    """Every pair of {4, 8, 16, 32, 64} dividing the extents with at most 1024 points, chosen independently
    (the first menu zipped two lists: 4x4, 8x8, 16x16 only)."""
    from steptp_env.strategies.util import MAX_TILE_POINTS, TILE_FACTORS, tile_menu

    assert tile_menu(256, 256) == [(a, b) for a in TILE_FACTORS for b in TILE_FACTORS if a * b <= MAX_TILE_POINTS]
    assert (4, 64) in tile_menu(256, 256) and (64, 4) in tile_menu(256, 256) and (64, 32) not in tile_menu(256, 256)
    assert tile_menu(12, 64) == [(4, 4), (4, 8), (4, 16), (4, 32)]
    assert tile_menu(6, 16) == [(2, 4), (2, 8), (3, 4), (3, 8)]  # no factor of the set divides 6: its divisors
    program = Program.parse(*MATMUL_64)
    offered = [a.text for a in REGISTRY["loop_tiling"].candidates(program)]
    assert "loop_tiling(nest=0, loops=[a,c], factors=[4,32])" in offered
    assert "loop_tiling(nest=0, loops=[c,d], factors=[32,8])" in offered
    _verified(program, ["loop_tiling(nest=0, loops=[a,c], factors=[4,32])",
                        "loop_tiling(nest=0, loops=[c,d], factors=[32,8])"])


def test_split_offers_divisors_up_to_64():
    from steptp_env.strategies.util import factor_menu

    assert factor_menu(256, 8, 64) == [2, 4, 8, 16, 32, 64]
    assert factor_menu(384, 8, 64) == [2, 4, 8, 12, 16, 24, 32, 64]  # powers of two, then multiples of 4
    assert factor_menu(7, 8, 64) == []
    program = Program.parse(*MATMUL_64)
    offered = [a.text for a in REGISTRY["loop_split"].candidates(program)]
    assert "loop_split(nest=0, loop=c, factor=32)" in offered and "loop_split(nest=0, loop=d, factor=64)" not in offered
    _verified(program, ["loop_split(nest=0, loop=c, factor=32)"])


def test_unrolling_offers_up_to_64_copies_counting_a_vector_loop_once():
    signature = sig(A=((32, 64), "input"), C=((32, 64), "output"))
    program = Program.parse("L^{32}_{a=0}L^{4}_{f=0}V^{16}_{c=0}[C^{f32,g}_{a,f*16+c}=A^{f32,g}_{a,f*16+c}*2;];",
                            signature)
    offered = [a.text for a in REGISTRY["loop_unrolling"].candidates(program)]
    # f: 4 copies of one vector operation; a: 32 x 4 = 128 copies, too many
    assert offered == ["loop_unrolling(nest=0, loop=f)"]
    wide = Program.parse("L^{64}_{a=0}V^{64}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];",
                         sig(A=((64, 64), "input"), C=((64, 64), "output")))
    assert [a.text for a in REGISTRY["loop_unrolling"].candidates(wide)] == ["loop_unrolling(nest=0, loop=a)"]
    _verified(program, offered)
    _verified(wide, ["loop_unrolling(nest=0, loop=a)"])


def test_reorder_moves_any_loop_to_any_position_in_one_action():
    """k to the middle of a tiled matmul (`[f,g,a,c,d]` -> `[f,g,d,a,c]`: register tile inside the k loop)
    took three actions with the first menu's swaps and moves to either end."""
    program = apply_action(Program.parse(*MATMUL_64), "loop_tiling(nest=0, loops=[a,c], factors=[4,16])")
    assert program.nests[0].loop_vars == ("f", "g", "a", "c", "d")
    offered = [a.text for a in REGISTRY["loop_reorder"].candidates(program)]
    assert "loop_reorder(nest=0, order=[f,g,d,a,c])" in offered
    assert len(offered) == len(set(offered)) == 16  # (5-1)^2 distinct single moves, all legal here
    _verified(program, ["loop_reorder(nest=0, order=[f,g,d,a,c])"])


def test_dependence_analysis_facts():
    deps = band_dependences(hand("matmul").nests[0])
    assert deps.parallel("a") and deps.parallel("c") and "d" in deps.reduced
    deps = band_dependences(hand("wave").nests[0])
    assert set(deps.ordered) == {"a", "c"}
    deps = band_dependences(hand("partial").nests[0])
    assert set(deps.ordered) == {"c", "d"} and deps.parallel("a")


def test_split_then_fusion_round_trip():
    program = hand("matmul")
    split = apply_action(program, "loop_split(nest=0, loop=d, factor=4)")
    assert split.leir == ("L^{8}_{a=0}L^{12}_{c=0}L^{4}_{f=0}L^{4}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+"
                          "A^{f32,g}_{a,f*4+d}*C^{f32,g}_{f*4+d,c};];")
    assert apply_action(split, "loop_fusion(nest=0, loops=[f,d])").leir == program.leir
    tiled = apply_action(program, "loop_tiling(nest=0, loops=[a,c], factors=[4,6])")
    assert tiled.nests[0].loop_vars == ("f", "g", "a", "c", "d")
    fused = apply_action(program, "loop_fusion(nest=0, loops=[a,c])")
    assert "D^{f32,g}_{c//12,c%12}" in fused.leir


# -- (b) illegal actions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("program, action, message", [
    ("matmul", "loop_split(nest=3, loop=a, factor=2)", "no nest 3"),
    ("matmul", "loop_split(nest=0, loop=z, factor=2)", "no loop 'z'"),
    ("matmul", "loop_split(nest=0, loop=a, factor=3)", "does not divide"),
    ("matmul", "loop_split(nest=0, loop=a, factor=8)", "between 2 and 7"),
    ("matmul", "loop_split(nest=0, loop=a, factor=x)", "must be an integer"),
    ("matmul", "loop_split(nest=0, loop=a)", "takes parameters"),
    ("wave", "loop_reorder(nest=0, order=[c,a])", "carry dependences"),
    ("matmul", "loop_reorder(nest=0, order=[a,c])", "not a permutation"),
    ("matmul", "loop_reorder(nest=0, order=[a,c,d])", "current order"),
    ("matmul", "loop_reorder(nest=0, order=a)", "list of loop names"),
    ("wave", "loop_tiling(nest=0, loops=[a,c], factors=[2,3])", "carry dependences"),
    ("matmul", "loop_tiling(nest=0, loops=[a,d], factors=[2,4])", "not consecutive"),
    ("matmul", "loop_tiling(nest=0, loops=[a,c], factors=[2])", "one integer factor per loop"),
    ("matmul", "loop_tiling(nest=0, loops=[a], factors=[2])", "at least two loops"),
    ("matmul", "loop_tiling(nest=0, loops=[a,c], factors=[3,5])", "does not divide"),
    ("matmul", "loop_fusion(nest=0, loops=[a,d])", "not consecutive"),
    ("matmul", "loop_fusion(nest=0, loops=[a,c,d])", "fuses two loops"),
    ("matmul", "loop_parallelization(nest=0, loop=d)", "reduction into D"),
    ("wave", "loop_parallelization(nest=0, loop=c)", "carries"),
    ("scalar", "loop_parallelization(nest=0, loop=a)", "overwritten"),
    ("matmul", "loop_vectorization(nest=0, loop=d)", "reduction into D"),
    ("matmul", "loop_binding(nest=0, loop=d, axis=tx)", "reduction into D"),
    ("matmul", "loop_binding(nest=0, loop=a, axis=qx)", "axis must be one of"),
    ("inner", "loop_binding(nest=0, loop=d, axis=tx)", "inner nest"),
    ("matmul", "loop_unrolling(nest=-1, loop=a)", "no nest -1"),
    ("long", "loop_vectorization(nest=0, loop=c)", "split it first"),
])
def test_illegal_actions(program, action, message):
    with pytest.raises(IllegalActionError, match=message):
        apply_action(hand(program), action)


def test_kind_and_axis_conflicts():
    program = apply_action(hand("matmul"), "loop_parallelization(nest=0, loop=a)")
    for action, message in [("loop_parallelization(nest=0, loop=c)", "nested with the parallel"),
                            ("loop_unrolling(nest=0, loop=a)", "already of kind P")]:
        with pytest.raises(IllegalActionError, match=message):
            apply_action(program, action)
    mixed = apply_action(program, "loop_vectorization(nest=0, loop=c)")
    with pytest.raises(IllegalActionError, match="cannot fuse a P loop with a V loop"):
        apply_action(mixed, "loop_fusion(nest=0, loops=[a,c])")
    inner = apply_action(hand("matmul"), "loop_parallelization(nest=0, loop=c)")
    with pytest.raises(IllegalActionError, match=r"would be P but \['d'\] carry"):
        apply_action(inner, "loop_fusion(nest=0, loops=[c,d])")
    bound = apply_action(hand("matmul"), "loop_binding(nest=0, loop=a, axis=tx)")
    with pytest.raises(IllegalActionError, match="already bound"):
        apply_action(bound, "loop_binding(nest=0, loop=c, axis=tx)")
    big = Program.parse("L^{64}_{a=0}L^{32}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c};];",
                        sig(A=((64, 32), "input"), C=((64, 32), "output")))
    big = apply_action(big, "loop_binding(nest=0, loop=a, axis=tx)")
    with pytest.raises(IllegalActionError, match="threads per block"):
        apply_action(big, "loop_binding(nest=0, loop=c, axis=ty)")


# -- (c) text round trip, (e) determinism ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", LOOP_STRATEGIES)
def test_action_text_round_trip_and_determinism(programs, strategy):
    st = REGISTRY[strategy]
    for program in programs.values():
        for target in ("llvm", "cuda"):
            first = st.candidates(program, target)
            assert first == st.candidates(program, target)
            assert len(set(first)) == len(first)
            for action in first:
                assert Action.parse(action.text) == action
                assert [k for k, _ in action.params] == list(st.params)


# -- (d) identify on reference rows ---------------------------------------------------------------------


def reference_rows() -> dict[str, list[dict]]:
    rows = [json.loads(line) for line in gzip.open(REF / "transitions.jsonl.gz", "rt")]
    by_strategy: dict[str, list[dict]] = {}
    for row in rows:
        if row["strategy"] in LOOP_STRATEGIES:
            by_strategy.setdefault(row["strategy"], []).append(row)
    return by_strategy


@pytest.mark.skipif(not (REF / "transitions.jsonl.gz").exists(), reason="reference corpus not available")
def test_identify_reference_rows():
    """Fixed sample: the 8 shortest rows per strategy whose original is the program itself (loop_fusion has
    none: all its rows undo a loop_split, so its 8 shortest rows are used). Full rates are in the report."""
    signatures = {p["id"]: p["signature"] for p in map(json.loads, open(REF / "programs.jsonl"))}
    rates = {}
    for strategy, rows in reference_rows().items():
        inputs = [r for r in rows if r["original_is_input_leir"]] or rows
        chosen = sorted(inputs, key=lambda r: (len(r["original_leir"]), r["transformed_leir"]))[:8]
        hits = 0
        for row in chosen:
            signature = signatures[row["program"]]
            before = Program.parse(row["original_leir"], signature)
            after = Program.parse(row["transformed_leir"], signature)
            found = identify(before, after)
            hits += any(a.strategy == strategy for a in found)
            # limiting the search to the label finds exactly the label's actions of the full search
            assert identify(before, after, strategies=[strategy]) == [a for a in found if a.strategy == strategy]
        rates[strategy] = hits / len(chosen)
    print("identify rates on the sample:", rates)
    assert set(rates) == set(LOOP_STRATEGIES)
    assert all(rate >= 0.9 for rate in rates.values()), rates


def test_canonical_text_tells_bound_axes_apart():
    from steptp_env.strategies import canonical_text

    sig = [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
           {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}]
    on_x = Program.parse("B^{4}_{bxa=0}L^{8}_{c=0}[C^{f32,g}_{bxa,c}=A^{f32,g}_{bxa,c};];", sig)
    on_y = Program.parse("B^{4}_{bya=0}L^{8}_{c=0}[C^{f32,g}_{bya,c}=A^{f32,g}_{bya,c};];", sig)
    renamed = Program.parse("B^{4}_{bxq=0}L^{8}_{d=0}[C^{f32,g}_{bxq,d}=A^{f32,g}_{bxq,d};];", sig)
    assert canonical_text(on_x) != canonical_text(on_y)
    assert canonical_text(on_x) == canonical_text(renamed)
