"""Analysis used by lowering and strategies: reductions, scans, read/write sets, use-def, dependences."""
from __future__ import annotations

import math

from steptp_env import Program
from steptp_env.ir import parse_expr
from steptp_env.ir.analysis import (accumulation, carried_dependences, element_positions, index_range,
                                    loop_iterations, reads, reduction, reduction_identity, reduction_length, scans,
                                    unwritten_reads, use_def, users, writes)
from steptp_env.ir.ast import equations

SIG = [{"name": "A", "shape": [4, 8], "dtype": "float32"}, {"name": "C", "shape": [4, 8], "dtype": "float32",
                                                              "role": "output"}]
SOFTMAX = ("L^{4}_{a=0}L^{8}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];"
           "L^{4}_{a=0}L^{8}_{c=0}[E^{f32,g}_{a}=E^{f32,g}_{a}+exp(A^{f32,g}_{a,c}-D^{f32,g}_{a});];"
           "L^{4}_{a=0}L^{8}_{c=0}[C^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c}-D^{f32,g}_{a})/E^{f32,g}_{a};];")


def eqs(text: str, sig=SIG):
    return [pair for nest in Program.parse(text, sig).nests for pair in equations(nest)]


def test_reductions_and_their_identities():
    (l0, e0), (l1, e1), (l2, e2) = eqs(SOFTMAX)
    assert reduction(l0, e0).op == "max" and reduction(l0, e0).reduced_vars == ("c",)
    assert reduction(l1, e1).op == "+" and reduction(l2, e2) is None
    assert reduction_identity("max", "float32") == -math.inf and reduction_identity("min", "float64") == math.inf
    assert reduction_identity("*", "float32") == 1 and reduction_identity("max", "int8") == -128
    assert reduction_identity("min", "int32") == 2 ** 31 - 1


def test_accumulation_forms():
    def acc(rhs):
        found = accumulation(eqs(f"L^{{4}}_{{a=0}}L^{{8}}_{{c=0}}[C^{{f32,g}}_{{a,c}}={rhs};];")[0][1])
        return None if found is None else (found[0], str(found[1]))
    assert acc("C^{f32,g}_{a,c}+A^{f32,g}_{a,c}") is not None
    assert acc("A^{f32,g}_{a,c}*C^{f32,g}_{a,c}")[0] == "*"
    assert acc("min(A^{f32,g}_{a,c},C^{f32,g}_{a,c})")[0] == "min"
    assert acc("C^{f32,g}_{a,c}+A^{f32,g}_{a,c}+A^{f32,g}_{a,0}-A^{f32,g}_{a,0}")[0] == "+"  # additive split
    assert acc("C^{f32,g}_{a,c}-A^{f32,g}_{a,c}")[0] == "-"
    assert acc("A^{f32,g}_{a,c}-C^{f32,g}_{a,c}") is None  # not an accumulation: the target is subtracted
    assert acc("C^{f32,g}_{a,c}*2+A^{f32,g}_{a,c}") is None
    assert acc("C^{f32,g}_{a,c}+C^{f32,g}_{a,c}") is None


def test_scans_are_found_along_the_lagging_variable():
    text = "L^{4}_{a=0}L^{8}_{c=0}[C^{f32,g}_{a,c}=if_then_else(c-1<0,0,C^{f32,g}_{a,c-1})+A^{f32,g}_{a,c};];"
    (loops, eq), = eqs(text)
    found = scans(loops, eq)
    assert [(s.tensor, s.var, s.offset) for s in found] == [("C", "c", 1)]
    assert "c" in carried_dependences(Program.parse(text, SIG).nests[0])
    assert reduction_length(Program.parse(text, SIG).nests) == 8


def test_read_write_sets_and_use_def():
    nests = Program.parse(SOFTMAX, SIG).nests
    assert reads(nests[1]) == ("E", "A", "D") and writes(nests[1]) == ("E",)
    chains = use_def(nests)
    assert chains[2] == {"A": (), "D": (0,), "E": (1,)}
    assert users(nests, 0) == (1, 2) and users(nests, 2) == ()


def test_carried_dependences():
    nests = Program.parse(SOFTMAX, SIG).nests
    assert set(carried_dependences(nests[0])) == {"c"}  # the max reduction
    assert carried_dependences(nests[2]) == {}  # elementwise: every loop may run in any order
    shifted = Program.parse("L^{4}_{a=0}L^{7}_{c=0}[C^{f32,g}_{a,c+1}=C^{f32,g}_{a,c}*2;];", SIG)
    assert "c" in carried_dependences(shifted.nests[0])


def test_index_range_and_loop_iterations():
    assert index_range(parse_expr("c*2+d*3-1"), {"c": 62, "d": 4}) == (-1, 130)
    assert index_range(parse_expr("tx//4"), {"tx": 16}) == (0, 3)
    assert index_range(parse_expr("tx%4"), {"tx": 16}) == (0, 3)
    assert index_range(parse_expr("3999-a"), {"a": 4000}) == (0, 3999)
    assert index_range(parse_expr("A^{i64,g}_{a}"), {"a": 4}) is None
    assert loop_iterations(Program.parse(SOFTMAX, SIG).nests) == 3 * 32


def test_element_positions_enumerate_exactly():
    def positions(texts: str | list[str], shape: tuple[int, ...], bounds: dict[str, int], shift: int = 0):
        texts = texts.split(",") if isinstance(texts, str) else texts
        found = element_positions(tuple(parse_expr(t) for t in texts), shape, bounds, shift)
        return None if found is None else sorted(set(found.tolist()))

    strided = positions("d*3+g*4", (63,), {"d": 19, "g": 3})
    assert len(strided) == 57 and 57 not in strided and 61 not in strided and strided[-1] == 62
    assert positions("a,h*2+c", (2, 8), {"a": 2, "h": 4, "c": 2}) == list(range(16))
    assert positions("c", (8,), {"c": 8}, shift=-1) == list(range(7))  # the predecessor of element 0 is left out
    assert positions("0,c%3", (1, 3), {"c": 7}) == [0, 1, 2]
    assert positions(["A^{i64,g}_{c}"], (4,), {"c": 4}) is None
    assert positions("c,d", (4096, 4096), {"c": 4096, "d": 4096}) is None  # past POINT_LIMIT


def test_unwritten_reads_include_index_tensors_in_subscripts():
    signature = [{"name": "A", "shape": [8], "dtype": "float32", "role": "input"},
                 {"name": "D", "shape": [8], "dtype": "float32", "role": "output"}]
    half = "L^{4}_{c=0}[K^{i32,g}_{c*2}=7-c*2;];"  # K_{1}, K_{3}, ... are never written
    gather = Program.parse(half + "L^{8}_{c=0}[D^{f32,g}_{c}=A^{f32,g}_{K^{i32,g}_{c}};];", signature)
    scatter = Program.parse(half + "L^{8}_{c=0}[D^{f32,g}_{K^{i32,g}_{c}}=A^{f32,g}_{c};];", signature)
    even = Program.parse(half + "L^{4}_{c=0}[D^{f32,g}_{c}=A^{f32,g}_{K^{i32,g}_{c*2}};];", signature)
    assert [(n, a.name) for n, a in unwritten_reads(gather)] == [(1, "K")]
    assert [(n, a.name) for n, a in unwritten_reads(scatter)] == [(1, "K")]
    assert unwritten_reads(even) == []
