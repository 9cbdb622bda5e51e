"""tensor_split_to_decouple_operators and tensor_concat_to_fuse_operators: one nest's iteration range split
in two along a loop, each part computing from its own copies of the operands (the parts joined by disjoint
writes, or by the reduction's operator when the loop is reduced), and two adjacent nests that apply the same
operator to different tensors run as one over their operands concatenated along a loop, with copies in and
out. Legality comes from the per-iteration access analysis of `graph_util`; results keep the reference's
copy-nest shapes so that `identify` recognises its rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import IllegalActionError
from ..ir.analysis import Reduction, element_positions, index_range, reads, reduction, scans, writes
from ..ir.ast import (Access, BinOp, Call, Compare, Const, Equation, Expr, Loop, Nest, Var, children, free_vars,
                      map_children, replace_accesses)
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (MAX_THREADS, affine_in, bounds_of, describe_loops, flat_equations, in_bounds,
                         loops_with_extent, mentions, names_param, one_equation, ranges_apart, reads_own_target,
                         shift_var, unique_value_subscripts, value_accesses)
from .util import fresh_tensor, int_param, quiet


# -- copies shared by tensor_split and tensor_concat -----------------------------------------------------------------

def _copy_nest(loops: tuple[Loop, ...], eqs: list[Equation]) -> Nest:
    """The reference's copy nest: the loops of the nest it feeds; a GPU-bound loop no copy uses runs once,
    and an unused parallel or vectorized loop becomes serial (it rewrites the same elements)."""
    used = {v for eq in eqs for i in eq.lhs.indices for v in free_vars(i)}
    fixed = []
    for loop in loops:
        if loop.var not in used and loop.kind == "B":
            loop = replace(loop, extent=1)
        elif loop.var not in used and loop.kind in ("P", "V"):
            loop = replace(loop, kind="L")
        fixed.append(loop)
    return Nest(tuple(fixed), tuple(eqs))


def _shift_access(acc: Access, var: str, offset: int) -> Access:
    return replace(acc, indices=tuple(shift_var(i, var, offset) for i in acc.indices))


def _copyable(program: Program, acc: Access, var: str, bounds: dict[str, int]) -> bool:
    """An operand can be copied part by part: its subscript moves with `var` by a constant per step and
    stays inside the tensor at every iteration."""
    return mentions(acc, var) and affine_in(acc, var) and in_bounds(program, acc, bounds)


# -- tensor_split_to_decouple_operators ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _SplitPlan:
    nest: Nest
    equation: Equation
    var: str
    extent: int
    reduction: Reduction | None
    spatial: bool
    copyable: tuple[str, ...]


def _split_plan(program: Program, index, var) -> _SplitPlan:
    nest, eq = one_equation(program, index)
    if not any(l.var == var for l in nest.loops):
        raise IllegalActionError(f"no loop {var!r} in nest {index} (loops: {', '.join(nest.loop_vars)})")
    loop = nest.loop(var)
    if loop.extent < 2:
        raise IllegalActionError(f"loop {var} runs {loop.extent} iteration: there is nothing to split")
    red = reduction(nest.loops, eq)
    if scans(nest.loops, eq) or (reads_own_target(eq) and red is None):
        raise IllegalActionError(f"{eq.lhs.name} reads itself outside a reduction (an update or a scan)")
    spatial = var in {v for i in eq.lhs.indices for v in free_vars(i)}
    if red is not None and var in red.reduced_vars:
        if not set(red.reduced_vars) - {var} and any(eq.lhs.name in writes(n) for n in program.nests[:index]):
            raise IllegalActionError(f"{eq.lhs.name} is written before the reduction; combining partial results "
                                     "would add to that value")
    elif not spatial:
        raise IllegalActionError(f"{eq.lhs.name} is rewritten in every iteration of {var}")
    elif not affine_in(eq.lhs, var):
        raise IllegalActionError(f"{eq.lhs.name}'s subscript is not affine in {var}")
    bounds = bounds_of(nest.loops)
    copyable = []
    for name, subs in unique_value_subscripts(eq.rhs).items():
        if name == eq.lhs.name or len(subs) != 1:
            continue
        acc = next(a for a in value_accesses(eq.rhs) if a.name == name)
        if _copyable(program, acc, var, bounds):
            copyable.append(name)
    return _SplitPlan(nest, eq, var, loop.extent, red, var not in (red.reduced_vars if red else ()), tuple(copyable))


def _partial_indices(plan: _SplitPlan) -> tuple[Expr, ...]:
    """Subscript of the partial results: the target's, plus the reduced loops other than the split one so
    that the combining nest still reduces over them (in loop order when the target uses plain subscripts)."""
    eq = plan.equation
    others = [v for v in (plan.reduction.reduced_vars if plan.reduction else ()) if v != plan.var]
    if plan.spatial or not others:
        return eq.lhs.indices
    if all(isinstance(i, Var) for i in eq.lhs.indices):
        kept = {i.name for i in eq.lhs.indices} | set(others)
        return tuple(Var(l.var) for l in plan.nest.loops if l.var in kept)
    return eq.lhs.indices + tuple(Var(v) for v in others)


def _combine(op: str, target: Access, parts: tuple[Access, Access]) -> Expr:
    if op in ("max", "min"):
        return Call(op, (target, Call(op, parts)))
    joined = "*" if op == "*" else "+"
    return BinOp(joined, target, BinOp(joined, *parts))


@register
class TensorSplitToDecoupleOperators(Strategy):
    """Split the iteration range of loop `loop` of nest `nest` at `at`: the operands in `tensors` are copied,
    part by part, into two fresh tensors; each part computes its own partial result; a last step puts the
    parts together (two writes of disjoint halves when the loop indexes the result, one combining reduction
    `X = X op (P1 op P2)` when the loop is reduced).

    Preconditions: the nest is flat with one equation that reads its own target only as a reduction; the loop
    runs at least two iterations and 0 < at < its extent; it indexes the result through an affine subscript or
    is one of the reduced loops (then the target is not written before unless other reduced loops remain, so
    the combining step starts from the reduction's identity); every tensor in `tensors` is read at one
    subscript, affine in the loop and inside the tensor at every iteration. Partial results of a reduction
    keep the other reduced loops as subscripts, so the combining nest completes their reduction (the
    reference's stale combine loop is not reproduced)."""

    name = "tensor_split_to_decouple_operators"
    params = ("nest", "loop", "at", "tensors")
    nest_local = True

    def nest_context(self, program: Program, index: int) -> tuple:
        """The shapes of the tensors the nest accesses (copies must stay inside them) and which of the
        tensors it writes an earlier nest wrote (a reduction split must start from its identity)."""
        nest = program.nests[index]
        names = dict.fromkeys((*writes(nest), *reads(nest)))
        earlier = {name for before in program.nests[:index] for name in writes(before)}
        return (tuple((name, program.tensors[name].shape) for name in names if name in program.tensors),
                tuple(name for name in writes(nest) if name in earlier))

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        found = []
        for loop in program.nests[i].loops:
            plan = quiet(_split_plan, program, i, loop.var)
            if plan is None:
                continue
            points = sorted({loop.extent // 2, loop.extent // 4} - {0})
            found += [self.action(nest=i, loop=loop.var, at=p, tensors=plan.copyable) for p in points]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index, at = int_param(action, "nest"), int_param(action, "at")
        plan = _split_plan(program, index, action["loop"])
        if not 0 < at < plan.extent:
            raise IllegalActionError(f"at must lie strictly inside loop {plan.var}'s range 0..{plan.extent}, got {at}")
        tensors = names_param(action, "tensors")
        bad = [t for t in tensors if t not in plan.copyable]
        if bad:
            raise IllegalActionError(f"{', '.join(bad)} cannot be copied part by part (copyable: "
                                     f"{', '.join(plan.copyable) or 'none'})")
        new = _split_nests(program, plan, at, tensors)
        return program.replace_nests(program.nests[:index] + tuple(new) + program.nests[index + 1:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The split point and the copy order, read off the first new nest of `after`."""
        found = []
        for i, nest in enumerate(before.nests):
            if i >= len(after.nests) or after.nests[:i] != before.nests[:i] or nest == after.nests[i]:
                continue
            head = after.nests[i]
            for loop, new in zip(nest.loops, head.loops):
                if loop.var == new.var and new.extent < loop.extent and loop.kind == new.kind:
                    plan = quiet(_split_plan, before, i, loop.var)
                    if plan is None:
                        continue
                    eqs = flat_equations(head) or []
                    order = tuple(eq.rhs.name for eq in eqs if isinstance(eq.rhs, Access))
                    tensors = order if all(t in plan.copyable for t in order) and len(order) == len(eqs) else ()
                    found.append(self.action(nest=i, loop=loop.var, at=new.extent, tensors=tensors))
            break
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, var, at = action["nest"], action["loop"], action["at"]
        plan = _split_plan(before, i, var)
        parts = f"{at} and {plan.extent - at} iterations of {var}"
        copies = (f"The operand(s) {', '.join(action['tensors'])} are copied part by part into separate tensors, "
                  "so each part reads only its own data. " if action["tensors"] else "")
        how = ("The loop indexes the result, so the two parts write disjoint parts of "
               f"{plan.equation.lhs.name}" if plan.spatial else
               f"The loop is reduced, so each part computes a partial {plan.reduction.op}-reduction and a final "
               "nest combines the two partial results")
        return (f"tensor_split_to_decouple_operators split nest {i} ({describe_loops(plan.nest.loops)}) along {var} "
                f"into two independent operators over {parts}. {copies}{how}; every element is computed exactly "
                "once, so the result is unchanged (up to the order of a reduction's additions). The two parts "
                "share no data and can run concurrently or be scheduled with different tile sizes; the copies "
                "and the combining step add memory traffic.")


def _split_nests(program: Program, plan: _SplitPlan, at: int, tensors: tuple[str, ...]) -> list[Nest]:
    eq, var, loops = plan.equation, plan.var, plan.nest.loops
    extents = (at, plan.extent - at)
    offsets = (0, at)
    taken: set[str] = set()

    def fresh() -> str:
        name = fresh_tensor(program, taken)
        taken.add(name)
        return name

    reads_at = {a.name: a for a in value_accesses(eq.rhs)}
    copies = {t: (fresh(), fresh()) for t in tensors}
    partials = (fresh(), fresh())
    partial = [Access(p, eq.lhs.dtype, "g", _partial_indices(plan)) for p in partials]

    nests: list[Nest] = []
    if tensors:
        for part in (0, 1):
            eqs = [Equation(replace(reads_at[t], name=copies[t][part], scope="g"),
                            _shift_access(reads_at[t], var, offsets[part])) for t in tensors]
            nests.append(_copy_nest(loops_with_extent(loops, var, extents[part]), eqs))

    for part in (0, 1):
        target = _shift_access(eq.lhs, var, offsets[part])

        def rewrite(acc: Access, part=part, target=target) -> Expr:
            if acc == target:
                return partial[part]
            if acc.name in copies:
                return replace(reads_at[acc.name], name=copies[acc.name][part], scope="g")
            return acc

        rhs = replace_accesses(shift_var(eq.rhs, var, offsets[part]), rewrite)
        nests.append(Nest(loops_with_extent(loops, var, extents[part]), (Equation(partial[part], rhs),)))
    if plan.spatial:
        for part in (0, 1):
            lhs = _shift_access(eq.lhs, var, offsets[part])
            nests.append(Nest(loops_with_extent(loops, var, extents[part]), (Equation(lhs, partial[part]),)))
    else:
        kept = tuple(l for l in loops if l.var != var)
        nests.append(Nest(kept, (Equation(eq.lhs, _combine(plan.reduction.op, eq.lhs, tuple(partial))),)))
    return nests


# -- tensor_concat_to_fuse_operators ------------------------------------------------------------------------------

def _pair_operands(one: Expr, two: Expr, targets: tuple[Access, Access], var: str,
                   pairs: list[tuple[Access, Access]]) -> bool:
    """Walk two right-hand sides in step; collect the pairs of accesses that depend on `var` (to be
    concatenated); True when the expressions are the same apart from those operands and their targets."""
    if type(one) is not type(two):
        return False
    if isinstance(one, Access):
        if one == targets[0] or two == targets[1]:
            return one == targets[0] and two == targets[1]
        if not mentions(one, var) and not mentions(two, var):
            return one == two
        if one.indices != two.indices or one.dtype != two.dtype:
            return False
        if (one, two) not in pairs:
            pairs.append((one, two))
        return True
    if isinstance(one, (Const, Var)):
        return one == two
    same_head = {BinOp: lambda a, b: a.op == b.op, Call: lambda a, b: a.func == b.func,
                 Compare: lambda a, b: a.ops == b.ops}.get(type(one), lambda a, b: True)
    kids1, kids2 = children(one), children(two)
    return same_head(one, two) and len(kids1) == len(kids2) and all(
        _pair_operands(a, b, targets, var, pairs) for a, b in zip(kids1, kids2))


@dataclass(frozen=True)
class _ConcatPlan:
    first: Nest
    second: Nest
    var: str
    pairs: tuple[tuple[Access, Access], ...]


def _concat_plan(program: Program, index, var) -> _ConcatPlan:
    first, eq1 = one_equation(program, index)
    if index + 1 >= len(program.nests):
        raise IllegalActionError(f"nest {index} is the last nest: there is nothing to concatenate it with")
    second, eq2 = one_equation(program, index + 1)
    if not any(l.var == var for l in first.loops):
        raise IllegalActionError(f"no loop {var!r} in nest {index} (loops: {', '.join(first.loop_vars)})")
    if len(first.loops) != len(second.loops) or any(
            (a.var, a.kind) != (b.var, b.kind) or (a.extent != b.extent and a.var != var)
            for a, b in zip(first.loops, second.loops)):
        raise IllegalActionError(f"nests {index} and {index + 1} differ in loops other than {var}")
    if eq1.lhs.name == eq2.lhs.name or eq1.lhs.indices != eq2.lhs.indices or eq1.lhs.dtype != eq2.lhs.dtype:
        raise IllegalActionError("the two results must be different tensors written at the same subscript")
    if Var(var) not in eq1.lhs.indices:
        raise IllegalActionError(f"{var} must be a plain subscript of the results (a loop the results are indexed by)")
    loop = first.loop(var)
    if loop.kind == "B" and var.startswith("t") and loop.extent + second.loop(var).extent > MAX_THREADS:
        raise IllegalActionError(f"{var} is bound to a thread axis: {loop.extent} + {second.loop(var).extent} "
                                 f"threads exceed the {MAX_THREADS} a block can hold")
    red1, red2 = reduction(first.loops, eq1), reduction(second.loops, eq2)
    for loops, eq, red in ((first.loops, eq1, red1), (second.loops, eq2, red2)):
        if scans(loops, eq) or (reads_own_target(eq) and red is None):
            raise IllegalActionError(f"{eq.lhs.name} reads itself outside a reduction")
    if (red1 is None) != (red2 is None) or (red1 and (red1.op, red1.reduced_vars) != (red2.op, red2.reduced_vars)):
        raise IllegalActionError("the two nests do not perform the same kind of reduction")
    if set(writes(first)) & set(reads(second)) or set(reads(first)) & set(writes(second)):
        raise IllegalActionError(f"nests {index} and {index + 1} depend on each other")
    pairs: list[tuple[Access, Access]] = []
    if not _pair_operands(eq1.rhs, eq2.rhs, (eq1.lhs, eq2.lhs), var, pairs):
        raise IllegalActionError("the two equations do not apply the same operator (they differ beyond the "
                                 f"operands indexed by {var})")
    for one, two in pairs:
        for acc, nest in ((one, first), (two, second)):
            if not affine_in(acc, var) or not in_bounds(program, acc, bounds_of(nest.loops)):
                raise IllegalActionError(f"{acc.name} cannot be copied (subscript not affine in {var}, or it "
                                         "leaves the tensor)")
    names = [one.name for one, _ in pairs]
    if len(set(names)) != len(names):
        raise IllegalActionError("an operand of the first nest is paired with two different operands")
    for one, _ in pairs:
        if not _halves_apart(one, first.loops, second.loops, var):
            raise IllegalActionError(f"the second half of {one.name}'s concatenation, {var} shifted by "
                                     f"{first.loop(var).extent}, would overwrite elements of the first "
                                     f"({print_expr(one)} mixes {var} with another loop in one subscript)")
    return _ConcatPlan(first, second, var, tuple(pairs))


def _halves_apart(one: Access, first: tuple[Loop, ...], second: tuple[Loop, ...], var: str) -> bool:
    """True when the concatenated copy of operand `one` keeps its halves on different elements: `one`'s
    subscript over loops `first`, and the same subscript with `var` shifted by its extent there over loops
    `second` (`R_{c*2+d}` with d < 2 shifted by 2 reaches `R_{2..7}`, which c > 0 already uses). Proved by
    the index ranges of one subscript where they do not overlap, else by enumerating the elements; False
    where neither works."""
    bounds1, bounds2 = bounds_of(first), bounds_of(second)
    shifted = _shift_access(one, var, bounds1[var])
    if ranges_apart(one, bounds1, shifted, bounds2):
        return True
    ranges = [(index_range(a, bounds1), index_range(b, bounds2)) for a, b in zip(one.indices, shifted.indices)]
    if any(r is None or r[0] < 0 for pair in ranges for r in pair):
        return False
    shape = tuple(max(r1[1], r2[1]) + 1 for r1, r2 in ranges)
    halves = element_positions(one.indices, shape, bounds1), element_positions(shifted.indices, shape, bounds2)
    return halves[0] is not None and halves[1] is not None and not np.isin(halves[1], halves[0]).any()


@register
class TensorConcatToFuseOperators(Strategy):
    """Run two adjacent nests that apply the same operator to different tensors as one operator: the operands
    that depend on loop `loop` are concatenated along it (copy nests write the first nest's operand and the
    second's, offset by the first extent, into one tensor; `tensors` gives the copy order by the first nest's
    operand names), one nest computes the concatenated result, and two nests copy each half back.

    Preconditions: both nests are flat with one equation, have the same loops except for the extent of
    `loop`, write different tensors at the same subscript with `loop` as a plain subscript, perform the same
    reduction (or none, and read no target otherwise), do not depend on each other, and apply the same
    expression apart from the operands indexed by `loop` (read at equal, affine, in-bounds subscripts). Only
    the concatenated dimension may differ in size: the reference's block-diagonal concatenation of tensors
    differing in several dimensions reads unwritten elements and is not offered."""

    name = "tensor_concat_to_fuse_operators"
    params = ("nest", "loop", "tensors")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests) - 1):
            for loop in program.nests[i].loops:
                plan = quiet(_concat_plan, program, i, loop.var)
                if plan is not None:
                    found.append(self.action(nest=i, loop=loop.var, tensors=tuple(a.name for a, _ in plan.pairs)))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        plan = _concat_plan(program, index, action["loop"])
        tensors = names_param(action, "tensors")
        names = [a.name for a, _ in plan.pairs]
        if sorted(tensors) != sorted(names):
            raise IllegalActionError(f"tensors must order the operands to concatenate ({', '.join(names)}), "
                                     f"got {list(tensors)}")
        order = sorted(plan.pairs, key=lambda p: tensors.index(p[0].name))
        return program.replace_nests(program.nests[:index] + tuple(_concat_nests(program, plan, order))
                                     + program.nests[index + 2:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The copy order, read off the first copy nest of `after`."""
        found = []
        for i in range(len(before.nests) - 1):
            if after.nests[:i] != before.nests[:i] or i >= len(after.nests):
                continue
            eqs = flat_equations(after.nests[i]) or []
            order = tuple(eq.rhs.name for eq in eqs if isinstance(eq.rhs, Access))
            for loop in before.nests[i].loops:
                if quiet(_concat_plan, before, i, loop.var) is not None:
                    found.append(self.action(nest=i, loop=loop.var, tensors=order))
            break
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, var = action["nest"], action["loop"]
        plan = _concat_plan(before, i, var)
        one, two = plan.first.loop(var).extent, plan.second.loop(var).extent
        results = [flat_equations(n)[0].lhs.name for n in (plan.first, plan.second)]
        return (f"tensor_concat_to_fuse_operators ran nests {i} and {i + 1}, which apply the same operator to "
                f"different tensors, as one operator over {var} = {one} + {two} iterations: the operands indexed by "
                f"{var} ({', '.join(action['tensors'])} and the second nest's counterparts) are concatenated along "
                f"{var}, one nest computes both results, and two nests copy them back into {results[0]} and "
                f"{results[1]}. It is legal because the nests are independent and every element of the "
                "concatenated result depends only on its own half. One larger launch replaces two smaller ones, "
                "which fills more parallel units; the concatenation and the copies add memory traffic.")


def _concat_nests(program: Program, plan: _ConcatPlan, pairs: list[tuple[Access, Access]]) -> list[Nest]:
    eq1, eq2 = flat_equations(plan.first)[0], flat_equations(plan.second)[0]
    var, offset = plan.var, plan.first.loop(plan.var).extent
    taken: set[str] = set()

    def fresh() -> str:
        name = fresh_tensor(program, taken)
        taken.add(name)
        return name

    joined = {one: fresh() for one, _ in pairs}
    result = Access(fresh(), eq1.lhs.dtype, "g", eq1.lhs.indices)
    copy1 = [Equation(replace(one, name=joined[one], scope="g"), one) for one, _ in pairs]
    copy2 = [Equation(_shift_access(replace(one, name=joined[one], scope="g"), var, offset), two) for one, two in pairs]

    def rewrite(expr: Expr) -> Expr:
        if isinstance(expr, Access):
            if expr == eq1.lhs:
                return result
            if expr in joined:
                return replace(expr, name=joined[expr], scope="g")
        return map_children(expr, rewrite)

    total = loops_with_extent(plan.first.loops, var, offset + plan.second.loop(var).extent)
    return [_copy_nest(plan.first.loops, copy1), _copy_nest(plan.second.loops, copy2),
            Nest(total, (Equation(result, rewrite(eq1.rhs)),)),
            Nest(plan.first.loops, (Equation(eq1.lhs, result),)),
            Nest(plan.second.loops, (Equation(eq2.lhs, _shift_access(result, var, offset)),))]
