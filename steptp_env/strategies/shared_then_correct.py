"""partially_equivalent_then_correct: two reductions that apply the same expression to two same-shaped
tensors become one reduction over the two concatenated, then the outputs that the shared form gets wrong
(windows across the seam of two padded sources) are recomputed: compute a cheaper shared form, then correct
the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import reads, reduction, reduction_identity, writes
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Nest, Var, accesses, free_vars,
                      map_children, replace_accesses)
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import loops_with_extent, range_chains, substitute
from .online_util import MINUS_INF, positional_renaming, rename_vars, single_equation
from .util import fresh_loop_var, fresh_tensor, int_param, nest_at, quiet, writer_nests


@dataclass(frozen=True)
class _Pad:
    """`P_{v} = if_then_else(cond, S_{v-offsets}, fill)` in flat nest `index`: a padded copy of S."""

    index: int
    nest: Nest
    target: Access
    cond: Expr
    source: Access
    fill: Expr

    def offset(self, dim: int) -> int | None:
        index, var = self.source.indices[dim], self.target.indices[dim]
        if index == var:
            return 0
        if isinstance(index, BinOp) and index.op == "-" and index.lhs == var and isinstance(index.rhs, Const) \
                and index.rhs.is_int:
            return index.rhs.value
        return None


def _pad(program: Program, name: str) -> _Pad | None:
    """The padded copy `name` (one nest writing if_then_else(in range, S at constant offsets, fill) at its loop
    variables), or None where `name` is anything else."""
    writers = writer_nests(program, name)
    eq = single_equation(program.nests[writers[0]]) if len(writers) == 1 else None
    rhs = eq.rhs if eq is not None else None
    if not (isinstance(rhs, Call) and rhs.func == "if_then_else" and isinstance(rhs.args[1], Access)
            and rhs.args[1].rank == eq.lhs.rank and rhs.args[1].name != name and not list(accesses(rhs.args[2]))):
        return None
    nest = program.nests[writers[0]]
    names = [i.name for i in eq.lhs.indices if isinstance(i, Var)]
    if len(names) != eq.lhs.rank or sorted(names) != sorted(l.var for l in nest.loops):
        return None
    pad = _Pad(writers[0], nest, eq.lhs, rhs.args[0], rhs.args[1], rhs.args[2])
    return pad if all(pad.offset(d) is not None for d in range(eq.lhs.rank)) else None


def _widen(cond: Expr, chain: Compare | None, extra: int) -> Expr:
    """`cond` with the upper bound of `chain` raised by `extra`."""
    if cond is chain:
        hi = chain.operands[2]
        return replace(chain, operands=chain.operands[:2] + (Const(hi.value + extra),))
    if isinstance(cond, And):
        return replace(cond, lhs=_widen(cond.lhs, chain, extra), rhs=_widen(cond.rhs, chain, extra))
    return cond


def _at(expr: Expr, var: str, index: Expr) -> Expr:
    """`expr` with loop variable `var` replaced by `index`, parenthesized where it is part of a larger
    subscript (`c+f` -> `(c+512)+f`, a whole subscript `c` -> `c+512`), as the reference writes it."""
    if isinstance(expr, Access):
        inner = replace(index, parens=1)
        return replace(expr, indices=tuple(index if i == Var(var) else substitute(i, {var: inner})
                                           for i in expr.indices))
    if expr == Var(var):
        return index
    return map_children(expr, lambda k: _at(k, var, index))


@dataclass(frozen=True)
class _Shared:
    """Two reductions X1 = reduce(e(T1)) (nest `first`) and X2 = reduce(e(T2)) (nest `second`, variables renamed
    to the first's) that differ only in the tensor they read, T1 or T2, concatenated along dimension `dim`.
    The reads index `dim` by output variable `out` plus (in a window of `window` elements) a reduced one.
    With `pads`, T1 and T2 are identical paddings (`lo` before, `hi` after along `dim`) of sources of length
    `n`, and the sources are concatenated and padded once; otherwise T1 and T2 themselves (length `n`)."""

    first: int
    second: int
    eq1: Equation
    eq2: Equation
    op: str
    operands: tuple[str, str]
    pads: tuple[_Pad, _Pad] | None
    dim: int
    out: str
    window: int
    n: int
    lo: int
    hi: int
    chain: Compare | None
    outputs: tuple[Loop, ...]

    @property
    def earliest(self) -> int:
        """Where the shared block goes: before the first nest of the group (reductions and paddings)."""
        return min([self.first] + [p.index for p in self.pads or ()])

    @property
    def extent(self) -> int:
        return next(l.extent for l in self.outputs if l.var == self.out)

    @property
    def wrong(self) -> tuple[int, int]:
        """How many outputs of X1 (the last ones) and of X2 (the first ones) read across the seam in the shared
        form: X1's windows that reach past S1 plus its padding before, X2's that start in its padding before."""
        return max(0, self.extent - max(0, self.lo + self.n - self.window + 1)), min(self.lo, self.extent)

    def copied(self, extra: int) -> int:
        """How many outputs of each the copy nest takes from the shared result: half of it each, the second
        output's aligned to its end (the reference's split), where the correction recomputes the rest; else all."""
        half = min((self.extent + self.n) // 2, self.extent)
        return half if self.extent - half <= min(self.recomputed(extra)) else self.extent

    def recomputed(self, extra: int) -> tuple[int, int]:
        """Outputs of X1 and X2 the correction recomputes: the wrong ones and `extra` more where any is."""
        return tuple(w + extra if w else 0 for w in self.wrong)


def _differing(program: Program, first, second) -> tuple[Equation, Equation, str, str, str, tuple[str, ...]]:
    """Two flat one-equation reductions with the same operator and loops whose values differ only in the tensor
    they read: (eq1, eq2 in the first's variables, operator, T1, T2, reduced variables)."""
    one, two = nest_at(program, first), nest_at(program, second)
    if not isinstance(first, int) or not isinstance(second, int) or not first < second:
        raise IllegalActionError("other must be a later nest than nest")
    eq1, eq2 = single_equation(one), single_equation(two)
    red1 = reduction(one.loops, eq1) if eq1 is not None else None
    red2 = reduction(two.loops, eq2) if eq2 is not None else None
    renaming = positional_renaming(two.loops, one.loops)
    if red1 is None or red2 is None or red1.op != red2.op or renaming is None:
        raise IllegalActionError(f"nests {first} and {second} are not the same kind of reduction over the same loops")
    eq2 = Equation(rename_vars(eq2.lhs, renaming), rename_vars(eq2.rhs, renaming))
    operand2 = reduction(one.loops, eq2).operand
    pairs = {(a.name, b.name) for a, b in zip(accesses(red1.operand), accesses(operand2)) if a.name != b.name}
    if len(pairs) != 1 or eq1.lhs.indices != eq2.lhs.indices or eq1.lhs.name == eq2.lhs.name:
        raise IllegalActionError(f"nests {first} and {second} do not apply one operator to two different tensors")
    (t1, t2), = pairs
    if replace_accesses(operand2, lambda a: replace(a, name=t1) if a.name == t2 else a) != red1.operand:
        raise IllegalActionError(f"nests {first} and {second} differ elsewhere than in {t1} and {t2}")
    if {t1, t2} & {eq1.lhs.name, eq2.lhs.name}:
        raise IllegalActionError(f"nests {first} and {second} read their own targets through {t1} or {t2}")
    return eq1, eq2, red1.op, t1, t2, red1.reduced_vars


def _slide(reads_: list[Access], dim: int, reduced: tuple[str, ...]) -> tuple[str, str | None]:
    """(output variable, reduced window variable or None) when every read's subscript at `dim` is `o` or
    `o+w` (unit stride and dilation)."""
    found = set()
    for acc in reads_:
        index = acc.indices[dim]
        terms = (index.lhs, index.rhs) if isinstance(index, BinOp) and index.op == "+" else (index,)
        names = tuple(t.name for t in terms if isinstance(t, Var))
        outer = [v for v in names if v not in reduced]
        if len(names) != len(terms) or len(outer) != 1 or len(names) - 1 != len(set(names) & set(reduced)):
            raise IllegalActionError(f"{print_expr(acc)} does not read dimension {dim} at an output variable (plus a "
                                     "window variable)")
        found.add((outer[0], next((v for v in names if v in reduced), None)))
    if len(found) != 1:
        raise IllegalActionError(f"the reads index dimension {dim} differently")
    return found.pop()


def _padding(program: Program, t1: str, t2: str) -> tuple[_Pad, _Pad] | None:
    """Both padded copies when T1 and T2 are the same padding of two same-shaped sources, else None."""
    pads = (_pad(program, t1), _pad(program, t2))
    if None in pads:
        return None
    s1, s2 = pads[0].source, pads[1].source
    rename = positional_renaming(pads[1].nest.loops, pads[0].nest.loops)
    same = rename is not None and replace_accesses(
        rename_vars(pads[1].nest.body[0].rhs, rename),
        lambda a: replace(a, name=s1.name) if a.name == s2.name else a) == pads[0].nest.body[0].rhs
    shapes = [program.tensors[s.name].shape for s in (s1, s2)]
    return pads if same and shapes[0] == shapes[1] and s1.name != s2.name else None


def _shared(program: Program, first, second, dim) -> _Shared:
    eq1, eq2, op, t1, t2, reduced = _differing(program, first, second)
    shape = program.tensors[t1].shape
    if program.tensors[t2].shape != shape or not isinstance(dim, int) or not 0 <= dim < len(shape):
        raise IllegalActionError(f"{t1} and {t2} differ in shape or have no dimension {dim!r}")
    operand = reduction(program.nests[first].loops, eq1).operand
    out, window = _slide([a for a in accesses(operand) if a.name == t1], dim, reduced)
    if any(out in free_vars(i) for a in accesses(operand) for d, i in enumerate(a.indices)
           if a.name != t1 or d != dim) or Var(out) not in eq1.lhs.indices:
        raise IllegalActionError(f"other operands read along {out}, or the result is not written at {out}: only "
                                 f"{t1} and {t2} can be concatenated along it")
    loops = program.nests[first].loops
    outputs = tuple(l for l in loops if l.var not in reduced)
    width = program.nests[first].loop(window).extent if window else 1
    pads = _padding(program, t1, t2)
    n, lo, hi, chain = shape[dim], 0, 0, None
    if pads is not None:
        var = pads[0].target.indices[dim].name
        chains = range_chains(pads[0].cond, var)
        n, lo = program.tensors[pads[0].source.name].shape[dim], pads[0].offset(dim)
        hi = shape[dim] - n - lo
        chain = chains[0] if chains else None
        exact = not chains and lo == hi == 0 or len(chains) == 1 and chain.ops == ("<=", "<") \
            and chain.operands == (Const(lo), Var(var), Const(lo + n))
        if not exact or hi < 0:
            raise IllegalActionError(f"the padding of {t1} along dimension {dim} is not lo<=v<lo+n")
    plan = _Shared(first, second, eq1, eq2, op, (t1, t2), pads, dim, out, width, n, lo, hi, chain, outputs)
    _check_placement(program, plan)
    return plan


def _check_placement(program: Program, plan: _Shared) -> None:
    """The shared block runs at `earliest`, the corrections at `second`: what the block reads must be complete
    by then, and the outputs must not be touched in between where that would see them early or uncorrected."""
    x1, x2 = plan.eq1.lhs.name, plan.eq2.lhs.name
    sources = [p.source.name for p in plan.pads] if plan.pads else list(plan.operands)
    inputs = {a.name for a in accesses(plan.eq1.rhs)} - {x1, *plan.operands} | set(sources)
    late = sorted(name for name in inputs if any(w >= plan.earliest for w in writer_nests(program, name)))
    if late:
        raise IllegalActionError(f"{', '.join(late)} {'is' if len(late) == 1 else 'are'} not complete before nest "
                                 f"{plan.earliest}, where the shared form would run")
    for name, own in ((x1, plan.first), (x2, plan.second)):
        if min(writer_nests(program, name)) != own:
            raise IllegalActionError(f"{name} is written before its reduction (nest {own})")
    corrected = plan.wrong[0] > 0
    for k in range(plan.earliest, plan.second):
        touched = set(reads(program.nests[k]) + writes(program.nests[k]))
        if k != plan.first and (x2 in touched or x1 in touched and (k < plan.first or corrected)):
            raise IllegalActionError(f"nest {k} touches {x1 if x1 in touched else x2}, which the shared form "
                                     f"writes earlier{' and corrects later' if corrected else ''}")


def _shared_nests(program: Program, plan: _Shared, extra: int) -> list[Nest]:
    """Concatenate the two tensors (their sources, padded once, with `pads`) along `dim`, reduce once over
    the longer output loop, and copy both results out (but what the correction recomputes anyway)."""
    joined = fresh_tensor(program)
    padded = fresh_tensor(program, {joined}) if plan.pads else joined
    result = fresh_tensor(program, {joined, padded})
    dtype = program.tensors[plan.operands[0]].dtype
    if plan.pads:
        pad = plan.pads[0]
        plain, var = pad.target.indices, pad.target.indices[plan.dim].name
        sources = tuple(replace(p.source, indices=plain) for p in plan.pads)
        shape = program.tensors[pad.source.name].shape
        copy_loops = tuple(replace(l, extent=shape[plain.index(Var(l.var))]) for l in pad.nest.loops)
    else:
        copy_loops = _loops_over(program.tensors[plan.operands[0]].shape)
        plain = tuple(Var(l.var) for l in copy_loops)
        sources = tuple(Access(t, dtype, "g", plain) for t in plan.operands)
    seam = tuple(BinOp("+", i, Const(plan.n)) if k == plan.dim else i for k, i in enumerate(plain))
    nests = [Nest(copy_loops, (Equation(Access(joined, dtype, "g", plain), sources[0]),
                               Equation(Access(joined, dtype, "g", seam), sources[1])))]
    if plan.pads:
        widened = loops_with_extent(pad.nest.loops, var, pad.nest.loop(var).extent + plan.n)
        cond = _widen(pad.cond, plan.chain, plan.n)
        nests.append(Nest(widened, (Equation(replace(pad.target, name=padded),
                                             Call("if_then_else", (cond, replace(pad.source, name=joined),
                                                                   pad.fill))),)))
    first = program.nests[plan.first]
    rename = {plan.eq1.lhs.name: result, plan.operands[0]: padded}
    shared = Equation(*(replace_accesses(e, lambda a: replace(a, name=rename.get(a.name, a.name)))
                        for e in (plan.eq1.lhs, plan.eq1.rhs)))
    nests.append(Nest(loops_with_extent(first.loops, plan.out, plan.extent + plan.n), (shared,)))
    copied = plan.copied(extra)
    skip = plan.extent - copied
    second = substitute(plan.eq2.lhs, {plan.out: BinOp("+", Var(plan.out), Const(skip))}) if skip else plan.eq2.lhs
    moved = substitute(plan.eq1.lhs, {plan.out: BinOp("+", Var(plan.out), Const(skip + plan.n))})
    nests.append(Nest(loops_with_extent(plan.outputs, plan.out, copied),
                      (Equation(plan.eq1.lhs, replace(plan.eq1.lhs, name=result)),
                       Equation(second, replace(moved, name=result)))))
    return nests


def _loops_over(shape: tuple[int, ...]) -> tuple[Loop, ...]:
    loops: list[Loop] = []
    for extent in shape:
        loops.append(Loop("L", extent, fresh_loop_var(Nest(tuple(loops), ()))))
    return tuple(loops)


def _corrections(program: Program, plan: _Shared, extra: int) -> list[Nest]:
    """Recompute from the original formula the last outputs of X1 and the first of X2 (in reverse order, as
    the reference writes them) that the shared form got wrong, and `extra` more on each side."""
    first = program.nests[plan.first]
    nests = []
    for eq, count, last in zip((plan.eq1, plan.eq2), plan.recomputed(extra), (True, False)):
        if count > plan.extent:
            raise IllegalActionError(f"extra={extra} recomputes more than the {plan.extent} outputs along {plan.out}")
        if not count:
            continue
        start = plan.extent - count
        index = (BinOp("+", Var(plan.out), Const(start)) if start else Var(plan.out)) if last \
            else BinOp("-", Const(count - 1), Var(plan.out))
        lhs, rhs = _at(eq.lhs, plan.out, index), _at(eq.rhs, plan.out, index)
        init = Const(reduction_identity(plan.op, eq.lhs.dtype))
        init = MINUS_INF if init.value == -math.inf else init
        inner = tuple(l for l in first.loops if l not in plan.outputs)
        nests.append(Nest(loops_with_extent(plan.outputs, plan.out, count),
                          (Equation(lhs, init), Nest(inner, (Equation(lhs, rhs),), trailing=True))))
    return nests


@register
class PartiallyEquivalentThenCorrect(Strategy):
    """Compute a cheaper shared form, then correct the rest: two reductions (nest `nest` and nest `other`) that
    apply the same expression to two same-shaped tensors become one reduction over the two concatenated along
    dimension `dim`, whose results are copied back to both outputs. Where the tensors are identical paddings of
    two sources and read through a sliding window along `dim`, the sources are concatenated and padded once;
    the shared result then equals both outputs except where a window crosses the seam (the last outputs of the
    first, the first of the second), and those are recomputed from the original padded inputs afterwards, plus
    `extra` more on each side. Along a dimension read without a window nothing needs correcting.

    Preconditions: both nests are flat one-equation reductions with the same operator and loops, differing
    only in the tensor they read; every read of it indexes `dim` by one output variable (plus a reduced window
    variable, unit stride) that no other operand reads; the tensors the shared form reads are complete before
    the first nest of the group; each output is first written by its own nest, and the nests in between do not
    touch the second output, nor the first where it is corrected later."""

    name = "partially_equivalent_then_correct"
    params = ("nest", "other", "dim", "extra")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests)):
            for j in range(i + 1, len(program.nests)):
                pair = quiet(_differing, program, i, j)
                if pair is not None:
                    rank = len(program.tensors[pair[3]].shape)
                    found += [self.action(nest=i, other=j, dim=d, extra=0) for d in range(rank)
                              if quiet(_shared, program, i, j, d) is not None]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        plan = _shared(program, int_param(action, "nest"), int_param(action, "other"), int_param(action, "dim"))
        extra = int_param(action, "extra")
        if extra < 0:
            raise IllegalActionError(f"extra must be at least 0, got {extra}")
        nests = program.nests
        middle = tuple(nests[k] for k in range(plan.earliest, plan.second) if k != plan.first)
        return program.replace_nests(nests[:plan.earliest] + tuple(_shared_nests(program, plan, extra)) + middle
                                     + tuple(_corrections(program, plan, extra)) + nests[plan.second + 1:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Every site with up to window-1 extra outputs recomputed per side (the reference recomputes
        window-1 whatever the padding)."""
        found = []
        for action in self.candidates(before):
            plan = _shared(before, action["nest"], action["other"], action["dim"])
            found += [self.action(**dict(dict(action.params), extra=e)) for e in range(1, plan.window)]
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        plan = _shared(before, action["nest"], action["other"], action["dim"])
        x1, x2 = plan.eq1.lhs.name, plan.eq2.lhs.name
        t1, t2 = plan.operands
        extent, n = plan.extent, plan.n
        what = (f"the sources of the padded copies {t1} and {t2} ({plan.pads[0].source.name} and "
                f"{plan.pads[1].source.name}), concatenated along dimension {plan.dim} and padded once"
                if plan.pads else f"{t1} and {t2} concatenated along dimension {plan.dim}")
        wrong = plan.wrong
        if any(wrong):
            extra = action["extra"]
            seam = (f"That shared form is only partially equivalent: a window of {plan.window} that crosses the "
                    f"seam reads the other tensor instead of padding, which affects the last {wrong[0]} outputs of "
                    f"{x1} and the first {wrong[1]} of {x2}; those"
                    + (f" and {extra} more on each side" if extra else "")
                    + " are recomputed from the original padded inputs afterwards, the correction. ")
        else:
            seam = (f"No output reads across the seam (the reads along dimension {plan.dim} stay inside each "
                    "tensor), so the correction is empty. ")
        return (f"partially_equivalent_then_correct computed {x1} (nest {plan.first}) and {x2} (nest "
                f"{plan.second}), the same {plan.op}-reduction applied to {t1} and to {t2}, as one shared "
                f"reduction over {what}: its {extent + n} outputs along {plan.out} hold {x1} at 0..{extent - 1} "
                f"and {x2} at {n}..{n + extent - 1}, copied back to both. {seam}It is legal because use-def "
                f"shows the two reductions apply the same expression and differ only in {t1} and {t2}, every read "
                f"of them moves with {plan.out} at unit stride, nothing else the reduction reads depends on "
                f"{plan.out}, and what the shared form reads is complete before nest {plan.earliest}, where it now "
                f"runs. Work: {2 * extent} outputs become {extent + n} in one nest instead of two, plus "
                f"{sum(plan.recomputed(action['extra']))} recomputed and a concatenation copy: worth "
                "it where launches or small reductions dominate (GPU), not for memory traffic. Every output "
                "sums the same terms in the same order, so results are bitwise identical.")
