"""CUDA-flavoured LEIR: bind the outermost loop of every nest to threadIdx.x, as the Step-TP frontend does.

Only used for `from_torch(..., target="cuda")`; CPU programs keep serial loops."""
from __future__ import annotations

from dataclasses import replace

from ..ir.analysis import carried_dependences
from ..ir.ast import Equation, Loop, Nest, equations, free_vars, rename_var
from ..ir.program import Program


def _rename_nest(nest: Nest, old: str, new: str) -> Nest:
    body = tuple(_rename_nest(s, old, new) if isinstance(s, Nest)
                 else Equation(rename_var(s.lhs, old, new), rename_var(s.rhs, old, new)) for s in nest.body)
    loops = tuple(Loop(l.kind, l.extent, new if l.var == old else l.var) for l in nest.loops)
    return replace(nest, loops=loops, body=body)


def _bindable(nest: Nest) -> str | None:
    """The outermost loop whose iterations are independent: it indexes every target and carries no
    reduction or scan. Binding any other loop to GPU threads would race."""
    carried = carried_dependences(nest)
    for loop in nest.loops:
        if loop.var in carried:
            continue
        if all(any(loop.var in free_vars(i) for i in eq.lhs.indices) for _, eq in equations(nest)):
            return loop.var
    return None


def bind_outer_loops(program: Program) -> Program:
    """Bind one independent loop of each nest to threadIdx.x (`B^{n}_{tx=0}`), moved outermost; a nest
    with no such loop runs on a one-thread launch (`B^{1}_{tx=0}` around it)."""
    nests = []
    for nest in program.nests:
        var = _bindable(nest)
        if var is None:
            nests.append(replace(nest, loops=(Loop("B", 1, "tx"), *nest.loops)))
            continue
        extent = nest.loop(var).extent
        renamed = _rename_nest(nest, var, "tx")
        others = tuple(l for l in renamed.loops if l.var != "tx")
        nests.append(replace(renamed, loops=(Loop("B", extent, "tx"), *others)))
    return program.replace_nests(nests)
