"""reduction_factorization: split a reduction over one loop into partial reductions and a combine nest.

Two forms, told apart by their third parameter:

- `split=S`: two partial reductions of the loop's iterations `< S` and `>= S` into fresh tensors, then a
  combine nest that folds both partials into the target (the Step-TP form).
- `lanes=W`: a lane-wise partial reduction. The loop (extent E, W dividing it) becomes an outer loop of E/W
  iterations at its position and a vector loop of W lanes moved innermost; lane `l` accumulates the
  iterations `f*W+l` into element `l` of a fresh partial tensor (the target's subscript plus the lane
  index), and a combine nest folds the W lanes into the target. LLVM does not reassociate float sums and
  maxima, so a reduction along a contiguous axis otherwise stays a chain of scalar `vaddss`/`vmaxss`.

The partials are reductions into fresh tensors, so they start from the operator's identity (docs/leir.md,
"Accumulations and reductions") and need no initialisation nest.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir.analysis import Reduction, loop_iterations, reduction, scans
from ..ir.ast import Access, BinOp, Call, Const, Equation, Expr, Loop, Nest, Var, map_children, replace_accesses
from ..ir.program import Program
from .base import Action, Strategy, register
from .loop_deps import band_dependences
from .loops import split_band
from .memory import _fail, _iterations, _rebuild, _vars_of, _written_before
from .util import fresh_loop_var, fresh_tensor, loop_in, nest_at

LANES = (4, 8, 16, 32, 64)
"""Lane counts the lane-wise form accepts (vector widths of 128..512-bit registers, and two of them)."""
MENU_LANES = (16, 8)
"""Lane counts the candidates offer, in this order: one AVX-512 register of float32 (or two of float64),
then one AVX2 register."""
SPLIT_PARAMS = ("nest", "loop", "split")
LANES_PARAMS = ("nest", "loop", "lanes")


def _combine(op: str, lhs: Expr, rhs: Expr) -> Expr:
    if op in ("max", "min"):
        return Call(op, (lhs, rhs))
    return BinOp("*" if op == "*" else "+", lhs, rhs)


def _shift_var(expr: Expr, var: str, offset: int) -> Expr:
    """`expr` with loop variable `var` replaced by `var+offset`; a trailing `+var` becomes `+var+offset`."""
    shifted = BinOp("+", Var(var), Const(offset))
    if isinstance(expr, Var):
        return shifted if expr.name == var else expr
    if isinstance(expr, BinOp) and expr.op == "+" and expr.rhs == Var(var) and not expr.parens:
        return BinOp("+", BinOp("+", _shift_var(expr.lhs, var, offset), Var(var)), Const(offset))
    return map_children(expr, lambda k: _shift_var(k, var, offset))


def _plain_subscripts(acc: Access) -> bool:
    """Subscripts that are distinct loop variables or integer constants (each written element is one
    element of the loops' iteration space)."""
    names = [i.name for i in acc.indices if isinstance(i, Var)]
    plain = all(isinstance(i, Var) or (isinstance(i, Const) and i.is_int) for i in acc.indices)
    return plain and len(names) == len(set(names))


def _partial_rhs(eq: Equation, part: Access) -> Expr:
    """The right side of `eq` accumulating into `part` instead of its target."""
    return replace_accesses(eq.rhs, lambda a: part if a == eq.lhs else a)


def _combine_equation(program: Program, n: int, target: Access, op: str, folded: Expr,
                      loops: tuple[Loop, ...]) -> Equation:
    """The equation of a combine nest over `loops` that folds `folded` into `target`: it accumulates when
    the combine itself reduces (it runs a loop the target's subscript does not use) or when nothing wrote
    the target before nest n (a fresh accumulation starts from the identity); otherwise it assigns, since
    the original reduction ignored any earlier value."""
    accumulate = bool({l.var for l in loops} - _vars_of(target.indices)) \
        or not _written_before(program, n, target.name)
    return Equation(target, _combine(op, target, folded) if accumulate else folded)


def _lanes_refusal(nest: Nest, n: int, var: str) -> str | None:
    """Why reduced loop `var` of nest n cannot become the innermost vector loop of the lanes form (None
    when it can): the nest already has a vector loop, or `var` carries a dependence besides the
    reduction's own, so its iterations may not be reordered."""
    vector = [l.var for l in nest.loops if l.kind == "V"]
    if vector:
        return f"nest {n} already has the vectorized loop(s) {', '.join(vector)}; the lane loop would be nested " \
               "with them"
    ordered = band_dependences(nest).ordered.get(var)
    if ordered:
        return f"the iterations of loop {var} cannot be reordered into lanes: it carries {'; '.join(ordered)}"
    return None


def _op_name(red: Reduction) -> str:
    return "+" if red.op == "-" else red.op


def _rounding(op: str) -> str:
    return " (floats may round differently)" if op in ("+", "*") else ""


@register
class ReductionFactorization(Strategy):
    """Factorize the reduction of a single-equation nest over loop `loop`, in one of two forms.

    `split=S`: two partial reductions (iterations `< S` and `>= S`, the second reading at `loop+S`) into
    fresh tensors, then a combine nest that folds both partials into the target. The partial tensors have
    the target's subscript (for a scalar target, the other loops' variables, whose sum the combine nest
    then takes); the combine nest runs only the target's loops, so each partial is folded once. It
    accumulates into the target when nothing wrote it before, and assigns otherwise (the original
    reduction ignored any earlier value).

    `lanes=W`: the loop (extent E) is split into an outer serial loop of E/W iterations with a fresh name,
    at the loop's position, and a vector loop `V^{W}` that keeps the loop's name, moved innermost; the
    nest accumulates into a fresh partial tensor with the target's dtype, scope and subscript plus the lane
    index as last dimension, and a combine nest over the target's loops plus a serial loop over the lanes
    folds the lanes into the target (a reduction over the lanes, so it starts from the identity like the
    original did).

    Preconditions (both forms): the nest is one equation (no inner nests); the equation is a reduction
    (`+ - * max min`) whose reduced variables include `loop`; it is not a prefix scan; its target
    subscripts are distinct loop variables or constants. Split form: `0 < split < extent`. Lanes form:
    `lanes` is one of 4, 8, 16, 32, 64, divides the extent and is smaller than it; the nest has no
    vectorized loop already; `loop` carries no dependence other than the reduction's own (its iterations
    may be reordered, so it may run innermost as lanes while the other loops keep their relative order).
    Reductions start from the operator's identity, so the partials need no initialisation.

    Candidates: for each reduced loop of extent >= 2, outer to inner, splits at extent/2 and extent - extent/4
    (ascending), then on llvm the lanes 16 and 8 that divide the extent and are smaller than it, when the
    lanes form applies (on cuda, V loops of more than 4 lanes are just unrolled).
    """

    name = "reduction_factorization"
    params = SPLIT_PARAMS
    alternative_params = LANES_PARAMS

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for n, nest in enumerate(program.nests):
            site = self._site(nest)
            if site is None:
                continue
            loops, eq, red = site
            for loop in loops:
                if loop.var in red.reduced_vars and loop.extent >= 2:
                    for split in sorted({loop.extent // 2, loop.extent - loop.extent // 4}):
                        if 0 < split < loop.extent:
                            found.append(self.action(nest=n, loop=loop.var, split=split))
                    menu = [w for w in MENU_LANES if w < loop.extent and loop.extent % w == 0]
                    if target == "llvm" and menu and _lanes_refusal(nest, n, loop.var) is None:
                        found.extend(self.action(nest=n, loop=loop.var, lanes=w) for w in menu)
        return found

    @staticmethod
    def _site(nest: Nest):
        """(loops, equation, reduction) of a factorizable single-equation nest, else None."""
        if len(nest.body) != 1 or not isinstance(nest.body[0], Equation):
            return None
        loops, eq = nest.loops, nest.body[0]
        red = reduction(loops, eq)
        if red is None or scans(loops, eq) or not _plain_subscripts(eq.lhs):
            return None
        return loops, eq, red

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        n, var = action["nest"], action["loop"]
        nest = nest_at(program, n)
        loop = loop_in(nest, var)
        site = self._site(nest)
        if site is None:
            _fail(f"nest {n} is not a single reduction equation over plain subscripts that can be factorized "
                  "(it has several statements, no reduction, a prefix scan, or computed target subscripts)")
        loops, eq, red = site
        if var not in red.reduced_vars:
            _fail(f"loop {var} is not reduced by nest {n} (reduced loops: {', '.join(red.reduced_vars)})")
        if action.get("lanes") is not None:
            new = self._lanes(program, n, nest, loop, red, action["lanes"])
        else:
            new = self._split(program, n, loop, loops, eq, red, action["split"])
        return _rebuild(program, list(program.nests[:n]) + new + list(program.nests[n + 1:]))

    @staticmethod
    def _split(program: Program, n: int, loop: Loop, loops: tuple[Loop, ...], eq: Equation, red: Reduction,
               split) -> list[Nest]:
        """The two partial nests and the combine nest of the split form."""
        var = loop.var
        if not isinstance(split, int) or not 0 < split < loop.extent:
            _fail(f"split must be an integer in 1..{loop.extent - 1} for loop {var} of extent {loop.extent}")
        first = fresh_tensor(program)
        second = fresh_tensor(program, {first})
        target = eq.lhs
        if target.indices:
            part_index, combine_loops = target.indices, tuple(l for l in loops if l.var in _vars_of(target.indices))
        else:
            combine_loops = tuple(l for l in loops if l.var != var)
            part_index = tuple(Var(l.var) for l in combine_loops)
        parts = []
        for name, extent, offset in ((first, split, 0), (second, loop.extent - split, split)):
            part = Access(name, target.dtype, target.scope, part_index)
            rhs = _partial_rhs(eq, part)
            if offset:
                rhs = _shift_var(rhs, var, offset)
            part_loops = tuple(replace(l, extent=extent) if l.var == var else l for l in loops)
            parts.append(Nest(part_loops, (Equation(part, rhs),)))
        a, b = (Access(p.body[0].lhs.name, target.dtype, target.scope, part_index) for p in parts)
        combine = _combine_equation(program, n, target, red.op, _combine(red.op, a, b), combine_loops)
        return parts + [Nest(combine_loops, (combine,))]

    @staticmethod
    def _lanes(program: Program, n: int, nest: Nest, loop: Loop, red: Reduction, lanes) -> list[Nest]:
        """The lane-wise partial nest and the combine nest of the lanes form."""
        var = loop.var
        if not isinstance(lanes, int) or lanes not in LANES:
            _fail(f"lanes must be one of {', '.join(map(str, LANES))}; got {lanes!r}")
        if lanes >= loop.extent or loop.extent % lanes:
            _fail(f"lanes={lanes} must divide the extent {loop.extent} of loop {var} and be smaller than it")
        refusal = _lanes_refusal(nest, n, var)
        if refusal:
            _fail(refusal)
        target = nest.body[0].lhs
        part = Access(fresh_tensor(program), target.dtype, target.scope, target.indices + (Var(var),))
        split = split_band(nest, var, lanes, fresh_loop_var(nest))
        loops = tuple(l for l in split.loops if l.var != var) + (Loop("V", lanes, var),)
        partial = replace(split, loops=loops, body=(Equation(part, _partial_rhs(split.body[0], part)),))
        used = _vars_of(target.indices)
        combine_loops = tuple(l for l in nest.loops if l.var in used) + (Loop("L", lanes, var),)
        combine = _combine_equation(program, n, target, red.op, part, combine_loops)
        return [partial, Nest(combine_loops, (combine,))]

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Split form: the split point is the extent of the factored loop in the first partial. Lanes form:
        the lanes are the extent of the partial's innermost (vector) loop, the factored loop the one whose
        extent shrank by that factor."""
        if len(after.nests) == len(before.nests) + 2:
            for n, nest in enumerate(before.nests):
                part = after.nests[n]
                if len(part.loops) != len(nest.loops):
                    continue
                changed = [(old, new) for old, new in zip(nest.loops, part.loops) if old.extent != new.extent]
                if len(changed) == 1:
                    return [self.action(nest=n, loop=changed[0][0].var, split=changed[0][1].extent)]
            return []
        if len(after.nests) == len(before.nests) + 1:
            for n, nest in enumerate(before.nests):
                part = after.nests[n]
                if len(part.loops) != len(nest.loops) + 1 or part.loops[-1].kind != "V":
                    continue
                lanes = part.loops[-1].extent
                old, new = [l.extent for l in nest.loops], [l.extent for l in part.loops[:-1]]
                found = [self.action(nest=n, loop=nest.loops[k].var, lanes=lanes) for k in range(len(old))
                         if old[:k] == new[:k] and old[k + 1:] == new[k + 1:] and new[k] * lanes == old[k]]
                if found:
                    return found
        return []

    def explain(self, before: Program, action: Action, after: Program) -> str:
        if action.get("lanes") is not None:
            return self._explain_lanes(before, action, after)
        n, var, split = action["nest"], action["loop"], action["split"]
        nest = before.nests[n]
        eq = nest.body[0]
        red = reduction(nest.loops, eq)
        extent = nest.loop(var).extent
        parts = after.nests[n:n + 3]
        names = [p.body[0].lhs.name for p in parts[:2]]
        combine = parts[2]
        op = _op_name(red)
        return (f"Factorized the {op}-reduction into {eq.lhs.name} in nest {n} along loop {var} "
                f"(extent {extent}): nest {n} now accumulates iterations 0..{split - 1} into {names[0]} and "
                f"nest {n + 1} iterations {split}..{extent - 1} into {names[1]}, reading at {var}+{split}; "
                f"nest {n + 2} folds the two partials into {eq.lhs.name} with "
                f"{_iterations(combine)} iteration(s). This is legal because {var} is a reduced loop of "
                f"{eq.lhs.name} (absent from its subscript), {op} is associative and commutative"
                f"{_rounding(op)}, and every reduction starts "
                f"from the identity of {op}, so each partial starts clean. The two partial nests are "
                f"independent of each other, which exposes parallel work along the reduction; the total "
                f"work grows from {loop_iterations(before.nests)} to {loop_iterations(after.nests)} loop "
                f"iterations because of the combine nest.")

    @staticmethod
    def _explain_lanes(before: Program, action: Action, after: Program) -> str:
        n, var, lanes = action["nest"], action["loop"], action["lanes"]
        nest = before.nests[n]
        eq = nest.body[0]
        red = reduction(nest.loops, eq)
        extent = nest.loop(var).extent
        partial, combine = after.nests[n], after.nests[n + 1]
        part = partial.body[0].lhs
        outer = next(l for l in partial.loops if l.var not in nest.loop_vars)
        shape = "x".join(map(str, after.tensors[part.name].shape))
        length = math.prod(l.extent for l in nest.loops if l.var in red.reduced_vars)
        over = ", ".join(reduction(partial.loops, partial.body[0]).reduced_vars)
        op = _op_name(red)
        float_note = (f" For {op} the float result may round differently from the scalar chain, since each lane "
                      f"sums its own terms; verification allows for it with a tolerance that grows with the "
                      f"reduction length ({length} terms here)." if op in ("+", "*") else
                      f" {op} picks one of its operands, so no rounding is involved.")
        return (f"Factorized the {op}-reduction into {eq.lhs.name} in nest {n} lane-wise along loop {var} "
                f"(extent {extent}): nest {n} splits {var} into an outer loop {outer.var} of "
                f"{extent // lanes} iterations and a vector loop {var} of {lanes} lanes moved innermost, lane "
                f"{var} accumulating the iterations {outer.var}*{lanes}+{var} into {part.name} ({shape}, the "
                f"subscript of {eq.lhs.name} plus the lane); nest {n + 1} folds the {lanes} lanes into "
                f"{eq.lhs.name} in {_iterations(combine)} iteration(s). Legal because {var} is a reduced loop "
                f"of {eq.lhs.name} (absent from its subscript) that carries only the reduction's own "
                f"dependence, so its iterations may be reordered and run innermost while the other loops keep "
                f"their order; {op} is associative and commutative; {part.name} is a reduction over "
                f"{over}, so it starts from the identity of {op}, and the "
                f"combine is a reduction over the lanes, so {eq.lhs.name} starts from the identity as before; "
                f"the lanes write distinct elements of {part.name}, so the vector loop carries no "
                f"dependence.{float_note} LLVM does not reassociate a float reduction by itself, so the "
                f"scalar chain of one {op} per term becomes one {lanes}-lane vector {op} per {lanes} terms; "
                f"the combine adds {_iterations(combine)} iteration(s) and {part.name} holds "
                f"{math.prod(after.tensors[part.name].shape)} element(s).")


__all__ = ["ReductionFactorization", "LANES", "MENU_LANES"]
