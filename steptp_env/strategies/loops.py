"""Loop strategies that restructure a band: split, reorder, tiling, fusion.

Legality comes from `loop_deps.band_dependences` (which loops carry dependences, and which of those only
carry reductions); the shapes of the results follow the Step-TP reference (`L^{4}_{h=0}B^{4}_{tx=0}`
with subscripts `h*4+tx` after a split). The strategies that change a loop's kind are in `loop_kinds`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterator

from ..errors import IllegalActionError
from ..ir.ast import (BinOp, Const, Expr, Loop, Nest, Var, accesses, all_loops, children, equations, free_vars,
                      map_children)
from ..ir.program import Program
from .base import Action, Strategy, register
from .loop_kinds import MAX_VECTOR, check_axis_limits
from .loop_sites import (Band, access_pattern, band_of, band_pairs, bands, changed_nest, first_difference, int_param,
                         listed, loop_site, map_body, replace_band, substitute, trip_count, var_list, with_nest)
from .util import factor_menu, fresh_loop_var, nest_at, tile_menu

MAX_REORDERS = 32
"""Most orders `loop_reorder` offers per band (one catalog slot each)."""
MAX_SPLIT = 64
SPLITS_PER_LOOP = 8
"""`loop_split` offers up to SPLITS_PER_LOOP divisors of a loop's extent, none above MAX_SPLIT."""


# -- loop_split ---------------------------------------------------------------------------------------


def split_band(nest: Nest, var: str, factor: int, outer_var: str) -> Nest:
    """`nest` (a band) with loop `var` split into `outer_var` (extent/factor, serial) around `var`
    (factor, same kind); every use of `var` becomes `outer_var*factor+var`."""
    loop = nest.loop(var)
    pos = nest.loop_vars.index(var)
    loops = (*nest.loops[:pos], Loop("L", loop.extent // factor, outer_var), replace(loop, extent=factor),
             *nest.loops[pos + 1:])
    index = BinOp("+", BinOp("*", Var(outer_var), Const(factor, str(factor))), Var(var))
    return map_body(replace(nest, loops=loops), lambda e: substitute(e, var, index))


def check_factor(loop: Loop, factor: int) -> None:
    if factor <= 1 or factor >= loop.extent:
        raise IllegalActionError(f"factor {factor} must be between 2 and {loop.extent - 1} (extent of "
                                 f"{loop.var} is {loop.extent})")
    if loop.extent % factor:
        raise IllegalActionError(f"factor {factor} does not divide the extent {loop.extent} of loop {loop.var}")


@register
class LoopSplit(Strategy):
    """Split loop `loop` of extent N into an outer serial loop of N/factor iterations and an inner loop of
    `factor` iterations that keeps the loop's name and kind; every use becomes `outer*factor+inner`.

    Preconditions: the loop exists in nest `nest`; `factor` is an integer in 2..N-1 that divides N. Always
    legal otherwise: the iterations run in the same order."""

    name = "loop_split"
    params = ("nest", "loop", "factor")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for loop in all_loops(nest):
            found.extend(self.action(nest=i, loop=loop.var, factor=f)
                         for f in factor_menu(loop.extent, SPLITS_PER_LOOP, MAX_SPLIT))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index, nest, band, loop = loop_site(program, action)
        factor = int_param(action, "factor")
        check_factor(loop, factor)
        new = split_band(band.nest, loop.var, factor, fresh_loop_var(nest))
        return with_nest(program, index, replace_band(nest, band.path, new))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        loop = band_of(before.nests[action["nest"]], action["loop"]).nest.loop(action["loop"])
        factor = action["factor"]
        new_band = band_of(after.nests[action["nest"]], action["loop"])
        outer = new_band.nest.loops[new_band.position(action["loop"]) - 1]
        return (f"Split loop {loop.var} of nest {action['nest']} (extent {loop.extent}) into an outer loop "
                f"{outer.var} of {loop.extent // factor} iterations and an inner loop {loop.var} of {factor}; "
                f"its subscripts become {outer.var}*{factor}+{loop.var}. Legal: {factor} divides {loop.extent}, "
                f"so the same {loop.extent} iterations run in the same order. The "
                f"inner loop of {factor} iterations is a unit for later tiling, vectorization, unrolling or "
                f"binding, while the total work stays {loop.extent} iterations.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in band_pairs(b_nest, a_nest):
            if len(a.nest.loops) == len(b.nest.loops) + 1:
                k = first_difference(b.nest.loops, a.nest.loops)
                if k < len(b.nest.loops):
                    found.append(self.action(nest=index, loop=b.vars[k], factor=a.nest.loops[k + 1].extent))
        return found


# -- loop_reorder -------------------------------------------------------------------------------------


def reorder_band(nest: Nest, order: tuple[str, ...]) -> Nest:
    return replace(nest, loops=tuple(nest.loop(v) for v in order))


def check_order(band: Band, order: tuple[str, ...]) -> None:
    deps = band.deps()
    if not deps.order_kept(order):
        fixed = [v for v in band.vars if v in deps.ordered]
        why = "; ".join(f"{v}: {', '.join(deps.ordered[v])}" for v in fixed)
        raise IllegalActionError(f"order {list(order)} changes the relative order of loops {fixed}, which carry "
                                 f"dependences ({why})")


def _moves(vars_: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Every order that moves one loop to another position: each loop moved innermost, then outermost,
    then to each position in between (outermost first); moving a loop one step is also moving its
    neighbour, so the caller drops repeats. One action moves a loop anywhere in the band."""
    n = len(vars_)
    for target in (n - 1, 0, *range(1, n - 1)):
        for k, v in enumerate(vars_):
            if k != target:
                rest = vars_[:k] + vars_[k + 1:]
                yield rest[:target] + (v,) + rest[target:]


@register
class LoopReorder(Strategy):
    """Permute the loops of one band (a nest's loop tuple, or an inner nest's); `order` lists them outermost
    first.

    Preconditions: `order` is a permutation of the loops of one band of nest `nest`, different from the
    current order; the loops that carry dependences other than reductions (prefix scans, elements written
    in one iteration and used in another, overwritten scalars) keep their relative order. Reduction loops
    may move: that only changes the order in which terms are accumulated."""

    name = "loop_reorder"
    params = ("nest", "order")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for band in bands(nest):
            if len(band.vars) < 2:
                continue
            deps = band.deps()
            orders: list[tuple[str, ...]] = []
            for order in _moves(band.vars):
                if order != band.vars and order not in orders and deps.order_kept(order):
                    orders.append(order)
            found.extend(self.action(nest=i, order=o) for o in orders[:MAX_REORDERS])
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = action["nest"]
        nest = nest_at(program, index)
        order = var_list(action, "order")
        if not order:
            raise IllegalActionError("loop_reorder: order is empty")
        band = band_of(nest, order[0])
        if sorted(order) != sorted(band.vars):
            raise IllegalActionError(f"order {list(order)} is not a permutation of the loops {list(band.vars)} "
                                     f"of one band")
        if order == band.vars:
            raise IllegalActionError(f"order {list(order)} is the current order")
        check_order(band, order)
        return with_nest(program, index, replace_band(nest, band.path, reorder_band(band.nest, order)))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        nest = before.nests[action["nest"]]
        order = action["order"]
        band = band_of(nest, order[0])
        deps = band.deps()
        moved = [v for v in order if v in deps.reduced]
        fixed = [v for v in band.vars if v in deps.ordered]
        if fixed:
            legal = f"{listed(fixed)} carry dependences and keep their relative order"
        else:
            legal = "no loop carries a dependence other than a reduction"
        if moved:
            legal += (f"; moving the reduction loop{'s' if len(moved) > 1 else ''} {listed(moved)} only "
                      f"changes the order in which terms are accumulated")
        inner = order[-1]
        return (f"Reordered the loops of nest {action['nest']} from [{', '.join(band.vars)}] to "
                f"[{', '.join(order)}]. Legal: {legal}. The innermost loop is now {inner} "
                f"({band.nest.loop(inner).extent} iterations): {access_pattern(band.nest, inner)}. The "
                f"{trip_count(band.nest.loops)} iterations are the same; only the order of memory accesses changes.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        for b, a in band_pairs(b_nest, a_nest):
            if b.nest.loops != a.nest.loops and sorted(b.nest.loops, key=lambda l: l.var) == \
                    sorted(a.nest.loops, key=lambda l: l.var):
                return [self.action(nest=index, order=a.vars)]
        return []


# -- loop_tiling --------------------------------------------------------------------------------------


@register
class LoopTiling(Strategy):
    """Tile a run of consecutive loops of one band: split each (`factors[i]` is the inner extent of
    `loops[i]`) and move all outer loops in front of all inner ones (`a c` -> `a_o c_o a c`); the inner
    loops keep their names and kinds, the outer ones are serial.

    Preconditions: at least two loops, consecutive in one band of nest `nest`, outermost first; each
    factor in 2..extent-1 divides its loop's extent; after splitting, moving the inner loops inside the
    outer ones keeps the relative order of the loops that carry non-reduction dependences."""

    name = "loop_tiling"
    params = ("nest", "loops", "factors")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for band in bands(nest):
            for x, y in zip(band.nest.loops, band.nest.loops[1:]):
                pairs = tile_menu(x.extent, y.extent)
                # legality depends on the loop order tiling makes, not on the (valid) factors
                if pairs and self._legal(nest, band, (x.var, y.var), pairs[0]):
                    found += [self.action(nest=i, loops=(x.var, y.var), factors=pair) for pair in pairs]
        return found

    def _legal(self, nest: Nest, band: Band, loops, factors) -> bool:
        try:
            self._tile(nest, band, loops, factors)
        except IllegalActionError:
            return False
        return True

    def _tile(self, nest: Nest, band: Band, loops: tuple[str, ...], factors: tuple[int, ...]) -> Nest:
        """Split every loop, then move the outer halves in front of the inner ones, if that keeps the
        order of the loops that carry dependences."""
        split = band.nest
        outers: list[str] = []
        for var, factor in zip(loops, factors):
            check_factor(band.nest.loop(var), factor)
            outers.append(fresh_loop_var(nest, {l.var for l in all_loops(split)}))
            split = split_band(split, var, factor, outers[-1])
        start = split.loop_vars.index(outers[0])
        order = split.loop_vars[:start] + tuple(outers) + loops + split.loop_vars[start + 2 * len(loops):]
        check_order(Band(band.path, band.enclosing, split), order)
        return reorder_band(split, order)

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = action["nest"]
        nest = nest_at(program, index)
        loops, factors = var_list(action, "loops"), action["factors"]
        if len(loops) < 2:
            raise IllegalActionError("loop_tiling needs at least two loops (use loop_split for one)")
        if not isinstance(factors, tuple) or len(factors) != len(loops) or \
                not all(isinstance(f, int) for f in factors):
            raise IllegalActionError(f"loop_tiling needs one integer factor per loop, got {factors!r}")
        band = band_of(nest, loops[0])
        start = band.position(loops[0])
        if band.vars[start:start + len(loops)] != loops:
            raise IllegalActionError(f"loops {list(loops)} are not consecutive loops of one band "
                                     f"(band: {list(band.vars)})")
        tiled = self._tile(nest, band, loops, factors)
        return with_nest(program, index, replace_band(nest, band.path, tiled))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        nest = before.nests[action["nest"]]
        band = band_of(nest, action["loops"][0])
        loops = [band.nest.loop(v) for v in action["loops"]]
        tile = math.prod(action["factors"])
        new_band = band_of(after.nests[action["nest"]], loops[0].var)
        first = new_band.position(loops[0].var)
        outers = new_band.vars[first - len(loops):first]
        tiled = {l.var for l in loops}
        touched = {acc.name: None for _, eq in equations(band.nest) for acc in [eq.lhs, *accesses(eq.rhs)]
                   if any(tiled & set(free_vars(i)) for i in acc.indices)}
        deps = band.deps()
        carried = [l.var for l in loops if l.var in deps.ordered]
        legal = ("none of the tiled loops carries a dependence other than a reduction" if not carried else
                 f"only {listed(carried)} carries a dependence, and the pieces of that loop keep their order")
        sizes = "x".join(str(f) for f in action["factors"])
        return (f"Tiled loops {listed([l.var for l in loops])} of nest {action['nest']} (extents "
                f"{'x'.join(str(l.extent) for l in loops)}) into {sizes} tiles: new outer loops "
                f"{listed(outers)} ({'x'.join(str(l.extent // f) for l, f in zip(loops, action['factors']))} "
                f"tiles) step from tile to tile and the original loops cover the {tile} points of one tile. "
                f"Legal: {legal}. The {trip_count(tuple(loops))} points are all still visited; within a tile the "
                f"accesses to {listed(touched)} stay in a small block that can be kept in cache while it is "
                f"reused.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in band_pairs(b_nest, a_nest):
            extra = len(a.nest.loops) - len(b.nest.loops)
            k = first_difference(b.nest.loops, a.nest.loops)
            if extra >= 2 and k + extra <= len(b.nest.loops):
                inner = a.nest.loops[k + extra:k + 2 * extra]
                found.append(self.action(nest=index, loops=b.vars[k:k + extra],
                                         factors=tuple(l.extent for l in inner)))
        return found


# -- loop_fusion --------------------------------------------------------------------------------------


def _is_fused_pattern(expr: Expr, outer: str, inner: str, factor: int) -> bool:
    """`outer*factor+inner`, in any operand order: the subscript a split writes."""
    if not (isinstance(expr, BinOp) and expr.op == "+"):
        return False
    scale = Const(factor)
    for scaled, plain in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
        if plain == Var(inner) and isinstance(scaled, BinOp) and scaled.op == "*" and \
                (scaled.lhs, scaled.rhs) in ((Var(outer), scale), (scale, Var(outer))):
            return True
    return False


def _fused_index(expr: Expr, outer: str, inner: str, factor: int, fused: str) -> Expr:
    """`outer*factor+inner` -> `fused`; other uses of `outer` -> `fused//factor`, of `inner` ->
    `fused%factor`."""
    if _is_fused_pattern(expr, outer, inner, factor):
        return Var(fused)
    if isinstance(expr, Var) and expr.name in (outer, inner):
        op = "//" if expr.name == outer else "%"
        return BinOp(op, Var(fused), Const(factor, str(factor)), parens=int(expr.parens > 0))
    return map_children(expr, lambda child: _fused_index(child, outer, inner, factor, fused))


def _only_pattern(expr: Expr, outer: str, inner: str, factor: int) -> bool:
    """The two loop vars occur in `expr` only inside `outer*factor+inner`."""
    if _is_fused_pattern(expr, outer, inner, factor):
        return True
    if isinstance(expr, Var):
        return expr.name not in (outer, inner)
    return all(_only_pattern(child, outer, inner, factor) for child in children(expr))


def _clean_fusion(nest: Nest, outer: str, inner: str, factor: int) -> bool:
    """Fusing needs no `//` or `%`: every use of the two loops is the pattern a split writes."""
    return all(_only_pattern(side, outer, inner, factor) for _, eq in equations(nest) for side in (eq.lhs, eq.rhs))


def fused_loop(outer: Loop, inner: Loop) -> Loop | None:
    """The loop that replaces `outer` and `inner`: their common kind, or the kind of the non-serial one of
    a serial/other pair, named like the loop whose kind it takes (the inner one when both are serial, as
    the reference names it). An unrolled loop fused with a serial one gives a serial loop (unrolling the
    whole product would multiply the code size). None when the kinds do not combine (two different
    non-serial kinds, or two bound loops, which name two GPU axes)."""
    extent = outer.extent * inner.extent
    if outer.kind == inner.kind and outer.kind != "B" or {outer.kind, inner.kind} == {"L", "U"}:
        return Loop(inner.kind if outer.kind == inner.kind else "L", extent, inner.var)
    if outer.kind == "L":
        return Loop(inner.kind, extent, inner.var)
    if inner.kind == "L":
        return Loop(outer.kind, extent, outer.var)
    return None


@register
class LoopFusion(Strategy):
    """Fuse two directly nested loops of one band, `outer` (extent A) around `inner` (extent B), into one
    loop of A*B iterations (kind and name from `fused_loop`): `outer*B+inner` becomes the fused variable,
    other uses of `outer` and `inner` become `fused//B` and `fused%B`. This is the inverse of `loop_split`,
    the reference's meaning of loop fusion (fusing whole nests is `operator_fusion`).

    Preconditions: `loops` names two consecutive loops of one band of nest `nest`, outer first; their
    kinds combine (equal, or one of them serial; never two bound loops); a fused parallel, vectorized or
    bound loop needs both loops free of carried dependences; a bound fused loop must respect its GPU axis
    limits, a vectorized one the 256-lane limit. Offered for pairs used only as `outer*B+inner` (undoing a
    split) and for the two outermost loops of a top-level nest when neither carries a dependence."""

    name = "loop_fusion"
    params = ("nest", "loops")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for band in bands(nest):
            deps = band.deps()
            for k, (o, n) in enumerate(zip(band.nest.loops, band.nest.loops[1:])):
                clean = _clean_fusion(band.nest, o.var, n.var, n.extent)
                outer_pair = k == 0 and not band.path and deps.parallel(o.var) and deps.parallel(n.var)
                if fused_loop(o, n) is not None and (clean or outer_pair):
                    action = self.action(nest=i, loops=(o.var, n.var))
                    try:
                        self.apply(program, action)
                    except IllegalActionError:
                        continue
                    found.append(action)
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = action["nest"]
        nest = nest_at(program, index)
        loops = var_list(action, "loops")
        if len(loops) != 2:
            raise IllegalActionError(f"loop_fusion fuses two loops, got {list(loops)}")
        band = band_of(nest, loops[0])
        pos = band.position(loops[0])
        if band.vars[pos:pos + 2] != loops:
            raise IllegalActionError(f"loops {list(loops)} are not consecutive loops of one band "
                                     f"(band: {list(band.vars)}); only a loop and the loop directly inside it fuse")
        outer, inner = band.nest.loop(loops[0]), band.nest.loop(loops[1])
        fused = fused_loop(outer, inner)
        if fused is None:
            raise IllegalActionError(f"cannot fuse a {outer.kind} loop with a {inner.kind} loop")
        kind = fused.kind
        deps = band.deps()
        if kind in ("P", "V", "B") and not (deps.parallel(outer.var) and deps.parallel(inner.var)):
            blocked = [v for v in loops if not deps.parallel(v)]
            raise IllegalActionError(f"the fused loop would be {kind} but {blocked} carry dependences "
                                     f"({'; '.join(r for v in blocked for r in deps.reasons(v))})")
        if kind == "B":
            check_axis_limits(nest, fused, replaced=(outer.var, inner.var))
        if kind == "V" and fused.extent > MAX_VECTOR:
            raise IllegalActionError(f"the fused vector loop would have {fused.extent} lanes (at most {MAX_VECTOR})")
        new_loops = band.nest.loops[:pos] + (fused,) + band.nest.loops[pos + 2:]
        new = map_body(replace(band.nest, loops=new_loops),
                       lambda e: _fused_index(e, outer.var, inner.var, inner.extent, fused.var))
        return with_nest(program, index, replace_band(nest, band.path, new))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loops"][0])
        outer, inner = (band.nest.loop(v) for v in action["loops"])
        fused = fused_loop(outer, inner)
        f, b = fused.var, inner.extent
        how = (f"every subscript {outer.var}*{b}+{inner.var} becomes {f}"
               if _clean_fusion(band.nest, outer.var, inner.var, b) else
               f"{outer.var} becomes {f}//{b} and {inner.var} becomes {f}%{b}")
        return (f"Fused loops {outer.var} ({outer.extent} iterations) and {inner.var} ({b}) of nest "
                f"{action['nest']} into one {fused.kind} loop {f} of {fused.extent} iterations; {how}. Legal: "
                f"the fused loop visits the same {fused.extent} index pairs in the same order"
                f"{'' if fused.kind in ('L', 'U') else ', and neither loop carries a dependence'}. It removes one "
                f"level of loop control and gives one loop of {fused.extent} iterations to parallelize, bind or "
                f"vectorize instead of {outer.extent} and {b}.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in band_pairs(b_nest, a_nest):
            if len(a.nest.loops) == len(b.nest.loops) - 1:
                k = first_difference(b.nest.loops, a.nest.loops)
                if k + 1 < len(b.nest.loops):
                    found.append(self.action(nest=index, loops=b.vars[k:k + 2]))
        return found
