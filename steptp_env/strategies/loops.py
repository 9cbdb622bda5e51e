"""Loop strategies: reorder, tiling, split, fusion, unrolling, parallelization, vectorization, binding.

They work on one *band* at a time: the loop tuple of a top-level nest or of an inner nest. Legality comes
from `loop_deps.band_dependences` (which loops carry dependences, and which of those only carry
reductions); the shapes of the results follow the Step-TP reference (`L^{4}_{h=0}B^{4}_{tx=0}` with
subscripts `h*4+tx` after a split, `bya` for a loop bound to blockIdx.y, ...).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..errors import IllegalActionError, StepTPError
from ..ir.ast import (And, BinOp, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                      all_loops, children, equations, free_vars, map_children, rename_var)
from ..ir.canonical import AXIS_PREFIXES
from ..ir.program import Program
from .base import Action, Strategy, register
from .loop_deps import BandDependences, affine, band_dependences
from .util import factor_menu, fresh_loop_var, nest_at, tile_menu

GPU_AXES = AXIS_PREFIXES
"""Bound-loop name prefixes, as the lowering reads them (`bya` is blockIdx.y)."""
AXIS_LIMITS = {"bx": 2 ** 31 - 1, "by": 65535, "bz": 65535, "tx": 1024, "ty": 1024, "tz": 64}
MAX_THREADS = 1024
"""CUDA's limit on the threads of one block (product of the threadIdx extents of a nest)."""
MAX_REORDERS = 32
"""Most orders `loop_reorder` offers per band (one catalog slot each)."""
MAX_SPLIT = 64
SPLITS_PER_LOOP = 8
"""`loop_split` offers up to SPLITS_PER_LOOP divisors of a loop's extent, none above MAX_SPLIT."""
MAX_UNROLL = 64
"""Largest extent `loop_unrolling` offers, and most copies of the innermost body unrolling may make: the
loop's extent times the iterations of the loops inside it, a vectorized loop counting once (its lanes are
one vector operation)."""
MENU_VECTOR = {"llvm": range(2, 65), "cuda": (2, 4)}
"""Extents `loop_vectorization` offers: up to 64 lanes on llvm; on cuda only 2 and 4, the widths its
lowering vectorizes (it unrolls other V loops)."""
MAX_VECTOR = 256
"""Longest loop `loop_vectorization` accepts: LLVM's compile time explodes on longer vectors with
shuffled accesses (a reversed 1024-lane copy took 18 s to build, 4096 lanes 97 s); split first."""


# -- sites ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """One loop tuple of a nest: where it is (`path` of body positions from the top-level nest), the loops
    around it and the nest that owns it."""

    path: tuple[int, ...]
    enclosing: tuple[Loop, ...]
    nest: Nest

    @property
    def vars(self) -> tuple[str, ...]:
        return self.nest.loop_vars

    def deps(self) -> BandDependences:
        return band_dependences(self.nest, self.enclosing)

    def position(self, var: str) -> int:
        return self.vars.index(var)


def bands(nest: Nest, path: tuple[int, ...] = (), enclosing: tuple[Loop, ...] = ()) -> Iterator[Band]:
    """Every band of a nest, outermost first."""
    yield Band(path, enclosing, nest)
    for i, stmt in enumerate(nest.body):
        if isinstance(stmt, Nest):
            yield from bands(stmt, path + (i,), enclosing + nest.loops)


def band_of(nest: Nest, var) -> Band:
    """The band that declares loop `var`; IllegalActionError when there is none."""
    for band in bands(nest):
        if var in band.vars:
            return band
    names = ", ".join(l.var for l in all_loops(nest))
    raise IllegalActionError(f"no loop {var!r} in this nest (loops: {names})")


def replace_band(nest: Nest, path: tuple[int, ...], new: Nest) -> Nest:
    """`nest` with the band at `path` replaced by `new`."""
    if not path:
        return new
    body = list(nest.body)
    body[path[0]] = replace_band(body[path[0]], path[1:], new)
    return replace(nest, body=tuple(body))


def with_nest(program: Program, index: int, nest: Nest) -> Program:
    nests = list(program.nests)
    nests[index] = nest
    try:
        return program.replace_nests(nests)
    except StepTPError as exc:  # a transformation must keep the program valid; say which check failed
        raise IllegalActionError(f"the result is not a valid program: {exc}") from None


def map_body(nest: Nest, fn: Callable[[Expr], Expr]) -> Nest:
    """`nest` with `fn` applied to both sides of every equation, inner nests included."""
    body = tuple(map_body(s, fn) if isinstance(s, Nest) else Equation(fn(s.lhs), fn(s.rhs)) for s in nest.body)
    return replace(nest, body=body)


def substitute(expr: Expr, var: str, value: Expr, parent: Expr | None = None) -> Expr:
    """`expr` with loop var `var` replaced by `value`, parenthesised like the reference does: bare as a whole
    subscript or call argument, in parentheses as an operand (`(j*257+c)+f`)."""
    if isinstance(expr, Var):
        if expr.name != var:
            return expr
        operand = isinstance(parent, (BinOp, Neg, Compare, And))
        return replace(value, parens=1) if operand and not isinstance(value, (Var, Const)) else value
    return map_children(expr, lambda child: substitute(child, var, value, expr))


def _int_param(action: Action, name: str) -> int:
    value = action[name]
    if not isinstance(value, int):
        raise IllegalActionError(f"{action.strategy}: {name} must be an integer, got {value!r}")
    return value


def _var_list(action: Action, name: str) -> tuple[str, ...]:
    value = action[name]
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise IllegalActionError(f"{action.strategy}: {name} must be a list of loop names, got {value!r}")
    return value


def _site(program: Program, action: Action) -> tuple[int, Nest, Band, Loop]:
    index = action["nest"]
    nest = nest_at(program, index)
    band = band_of(nest, action["loop"])
    return index, nest, band, band.nest.loop(action["loop"])


def _changed_nest(before: Program, after: Program) -> tuple[int, Nest, Nest] | None:
    """The only nest that differs between two programs with the same number of nests."""
    if len(before.nests) != len(after.nests):
        return None
    changed = [i for i, (b, a) in enumerate(zip(before.nests, after.nests)) if b != a]
    return (changed[0], before.nests[changed[0]], after.nests[changed[0]]) if len(changed) == 1 else None


def _band_pairs(before: Nest, after: Nest) -> Iterator[tuple[Band, Band]]:
    """Bands at the same path in two versions of a nest."""
    found = {b.path: b for b in bands(after)}
    for band in bands(before):
        if band.path in found:
            yield band, found[band.path]


def _first_difference(a: tuple[Loop, ...], b: tuple[Loop, ...]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# -- facts used in explanations -----------------------------------------------------------------------


def _trip(loops: tuple[Loop, ...], vector_once: bool = False) -> int:
    return math.prod(1 if vector_once and l.kind == "V" else l.extent for l in loops)


def _inner_trip(band: Band, var: str, vector_once: bool = False) -> int:
    """Iterations of everything a loop runs per iteration: the band loops inside it and the largest
    inner nest (with `vector_once`, a vectorized loop counts as one iteration)."""
    inside = _trip(band.nest.loops[band.position(var) + 1:], vector_once)
    inner = [b for b in bands(band.nest) if b.path]
    return inside * max((_trip(b.enclosing[len(band.nest.loops):] + b.nest.loops, vector_once) for b in inner),
                        default=1)


def strides(nest: Nest, var: str) -> tuple[list[str], list[str], list[str]]:
    """Tensors whose accesses move by one element per iteration of `var` (last subscript has coefficient 1
    and no other subscript mentions it), those it moves along another way, and those it does not touch
    (reused across its iterations)."""
    unit: dict[str, None] = {}
    other: dict[str, None] = {}
    reused: dict[str, None] = {}
    for _, eq in equations(nest):
        for acc in [eq.lhs, *accesses(eq.rhs)]:
            forms = [affine(i) for i in acc.indices]
            coeffs = [None if f is None else f[0].get(var, 0) for f in forms]
            if all(c == 0 for c in coeffs):
                reused.setdefault(acc.name, None)
            elif coeffs[-1] == 1 and all(c == 0 for c in coeffs[:-1]):
                unit.setdefault(acc.name, None)
            else:
                other.setdefault(acc.name, None)
    return list(unit), [n for n in other if n not in unit], [n for n in reused if n not in unit and n not in other]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _names(names) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def access_pattern(nest: Nest, var: str, step: str = "consecutive iterations") -> str:
    """How the accesses move along loop `var`, in words: contiguous, strided, reused."""
    unit, strided, reused = strides(nest, var)
    parts = []
    if unit:
        parts.append(f"{step} of {var} touch adjacent elements of {_names(unit)}")
    if strided:
        parts.append(f"they jump through {_names(strided)} with a larger stride")
    if reused:
        parts.append(f"they reuse the same element of {_names(reused)}")
    return "; ".join(parts) if parts else f"{var} indexes no tensor directly"


def _legal_fact(band: Band, var: str) -> str:
    deps = band.deps()
    if deps.parallel(var):
        return f"no dependence is carried by loop {var}: every iteration touches its own elements"
    return f"loop {var} carries: " + "; ".join(deps.reasons(var))


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
        index, nest, band, loop = _site(program, action)
        factor = _int_param(action, "factor")
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
        changed = _changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in _band_pairs(b_nest, a_nest):
            if len(a.nest.loops) == len(b.nest.loops) + 1:
                k = _first_difference(b.nest.loops, a.nest.loops)
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
        order = _var_list(action, "order")
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
            legal = f"{_names(fixed)} carry dependences and keep their relative order"
        else:
            legal = "no loop carries a dependence other than a reduction"
        if moved:
            legal += (f"; moving the reduction loop{'s' if len(moved) > 1 else ''} {_names(moved)} only "
                      f"changes the order in which terms are accumulated")
        inner = order[-1]
        return (f"Reordered the loops of nest {action['nest']} from [{', '.join(band.vars)}] to "
                f"[{', '.join(order)}]. Legal: {legal}. The innermost loop is now {inner} "
                f"({band.nest.loop(inner).extent} iterations): {access_pattern(band.nest, inner)}. The "
                f"{_trip(band.nest.loops)} iterations are the same; only the order of memory accesses changes.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = _changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        for b, a in _band_pairs(b_nest, a_nest):
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
        loops, factors = _var_list(action, "loops"), action["factors"]
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
                 f"only {_names(carried)} carries a dependence, and the pieces of that loop keep their order")
        sizes = "x".join(str(f) for f in action["factors"])
        return (f"Tiled loops {_names([l.var for l in loops])} of nest {action['nest']} (extents "
                f"{'x'.join(str(l.extent) for l in loops)}) into {sizes} tiles: new outer loops "
                f"{_names(outers)} ({'x'.join(str(l.extent // f) for l, f in zip(loops, action['factors']))} "
                f"tiles) step from tile to tile and the original loops cover the {tile} points of one tile. "
                f"Legal: {legal}. The {_trip(tuple(loops))} points are all still visited; within a tile the "
                f"accesses to {_names(touched)} stay in a small block that can be kept in cache while it is "
                f"reused.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        changed = _changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in _band_pairs(b_nest, a_nest):
            extra = len(a.nest.loops) - len(b.nest.loops)
            k = _first_difference(b.nest.loops, a.nest.loops)
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
        loops = _var_list(action, "loops")
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
        changed = _changed_nest(before, after)
        if changed is None:
            return []
        index, b_nest, a_nest = changed
        found = []
        for b, a in _band_pairs(b_nest, a_nest):
            if len(a.nest.loops) == len(b.nest.loops) - 1:
                k = _first_difference(b.nest.loops, a.nest.loops)
                if k + 1 < len(b.nest.loops):
                    found.append(self.action(nest=index, loops=b.vars[k:k + 2]))
        return found


# -- loop kinds: unrolling, parallelization, vectorization, binding ------------------------------------


def set_kind(nest: Nest, band: Band, var: str, kind: str, new_var: str | None = None) -> Nest:
    """`nest` with loop `var` of `band` turned into kind `kind` (and renamed to `new_var`)."""
    loops = tuple(replace(l, kind=kind, var=new_var or l.var) if l.var == var else l for l in band.nest.loops)
    new = replace(band.nest, loops=loops)
    if new_var and new_var != var:
        new = map_body(new, lambda e: rename_var(e, var, new_var))
    return replace_band(nest, band.path, new)


def _loops_around(band: Band, var: str) -> tuple[Loop, ...]:
    return band.enclosing + band.nest.loops[:band.position(var)]


def _loops_inside(band: Band, var: str) -> tuple[Loop, ...]:
    inner = tuple(l for b in bands(band.nest) if b.path for l in b.nest.loops)
    return band.nest.loops[band.position(var) + 1:] + inner


def _kind_site(strategy: Strategy, program: Program, action: Action, kind: str) -> tuple[int, Nest, Band, Loop]:
    strategy.check(action)
    index, nest, band, loop = _site(program, action)
    if loop.kind != "L":
        raise IllegalActionError(f"loop {loop.var} is already of kind {loop.kind}; {strategy.name} turns a serial "
                                 f"(L) loop into {kind}")
    return index, nest, band, loop


def _require_parallel(band: Band, loop: Loop, what: str) -> None:
    deps = band.deps()
    if not deps.parallel(loop.var):
        raise IllegalActionError(f"cannot {what} loop {loop.var}: it carries " + "; ".join(deps.reasons(loop.var)))


def kind_changes(before: Program, after: Program, kind: str) -> list[tuple[int, str, str]]:
    """(nest, loop name before, loop name after) where one loop of a band became `kind` and nothing else
    about the band's loops changed but that loop's name: what `infer` of the kind strategies looks for."""
    changed = _changed_nest(before, after)
    if changed is None:
        return []
    index, b_nest, a_nest = changed
    found = []
    for b, a in _band_pairs(b_nest, a_nest):
        if len(b.nest.loops) != len(a.nest.loops):
            continue
        diff = [k for k, (x, y) in enumerate(zip(b.nest.loops, a.nest.loops)) if x != y]
        if len(diff) == 1 and a.nest.loops[diff[0]].kind == kind:
            found.append((index, b.vars[diff[0]], a.vars[diff[0]]))
    return found


@register
class LoopUnrolling(Strategy):
    """Mark a serial loop as unrolled (L -> U): the compiler replicates its body once per iteration.

    Preconditions: the loop exists and is serial. Always legal: unrolling keeps the order of iterations.
    Offered for extents 2..64 when the extent times the iterations inside it (a vectorized loop counting
    once) is at most 64: bounded code growth, enough to unroll a 16x16 tile around 16 vector lanes."""

    name = "loop_unrolling"
    params = ("nest", "loop")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for band in bands(nest):
            for loop in band.nest.loops:
                if loop.kind == "L" and 2 <= loop.extent <= MAX_UNROLL and \
                        loop.extent * _inner_trip(band, loop.var, vector_once=True) <= MAX_UNROLL:
                    found.append(self.action(nest=i, loop=loop.var))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        index, nest, band, loop = _kind_site(self, program, action, "U")
        return with_nest(program, index, set_kind(nest, band, loop.var, "U"))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loop"])
        loop = band.nest.loop(action["loop"])
        inside = _inner_trip(band, loop.var)
        return (f"Unrolled loop {loop.var} of nest {action['nest']}: its {loop.extent} iterations become "
                f"{loop.extent} straight-line copies of the body (each running "
                f"{_count(inside, 'inner iteration')}). Legal: unrolling runs the same iterations in the same "
                f"order. "
                f"It removes {loop.extent} loop-counter updates and branches per entry into the loop and lets "
                f"the compiler schedule the copies together, at the price of a body {loop.extent} times larger.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        return [self.action(nest=i, loop=v) for i, v, _ in kind_changes(before, after, "U")]


@register
class LoopParallelization(Strategy):
    """Run the iterations of a serial loop on parallel CPU threads (L -> P).

    Preconditions: the loop exists and is serial; it carries no dependence (not a reduction or scan loop,
    no element written in one iteration and used in another); no parallel loop encloses it or lies inside
    it. Offered on llvm only, for the two outermost such loops of each top-level nest."""

    name = "loop_parallelization"
    params = ("nest", "loop")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        if target != "llvm":
            return []
        nest = program.nests[i]
        found = []
        band = Band((), (), nest)
        if any(l.kind == "P" for l in all_loops(nest)):
            return found
        deps = band.deps()
        eligible = [l for l in nest.loops if l.kind == "L" and deps.parallel(l.var)]
        found.extend(self.action(nest=i, loop=l.var) for l in eligible[:2])
        return found

    def apply(self, program: Program, action: Action) -> Program:
        index, nest, band, loop = _kind_site(self, program, action, "P")
        _require_parallel(band, loop, "parallelize")
        nested = [l.var for l in _loops_around(band, loop.var) + _loops_inside(band, loop.var) if l.kind == "P"]
        if nested:
            raise IllegalActionError(f"loop {loop.var} is nested with the parallel loop(s) {nested}; the CPU "
                                     f"runtime has no nested parallelism")
        return with_nest(program, index, set_kind(nest, band, loop.var, "P"))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loop"])
        loop = band.nest.loop(action["loop"])
        outside = _trip(_loops_around(band, loop.var))
        work = _count(_inner_trip(band, loop.var), "inner iteration")
        repeat = f", and the loop is entered {outside} times (once per iteration of the loops around it)"
        return (f"Parallelized loop {loop.var} of nest {action['nest']}: its {loop.extent} iterations are "
                f"shared among CPU threads, each iteration doing {work} of work{repeat if outside > 1 else ''}. "
                f"Legal: {_legal_fact(band, loop.var)}. With T threads the loop takes about 1/T of its serial "
                f"time once {loop.extent} iterations are enough to keep T threads busy; each entry into the "
                f"loop pays a thread-pool launch.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        return [self.action(nest=i, loop=v) for i, v, _ in kind_changes(before, after, "P")]


def _unit_stride_writes(band: Band, var: str) -> bool:
    """Every store under the loop writes consecutive elements along `var`: the target's last subscript
    has coefficient 1 in `var` and no other subscript mentions it."""
    for _, eq in equations(band.nest):
        forms = [affine(i) for i in eq.lhs.indices]
        if not forms or any(f is None for f in forms):
            return False
        if forms[-1][0].get(var, 0) != 1 or any(f[0].get(var, 0) for f in forms[:-1]):
            return False
    return True


@register
class LoopVectorization(Strategy):
    """Execute the iterations of a serial loop as SIMD vector lanes (L -> V).

    Preconditions: the loop exists and is serial with at most 256 iterations; it carries no dependence; no
    vectorized loop encloses it or lies inside it. Offered only for innermost loops whose stores are
    unit-stride along the loop, with 2..64 iterations on llvm (2 or 4 on cuda, which vectorizes only
    those)."""

    name = "loop_vectorization"
    params = ("nest", "loop")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        nest = program.nests[i]
        found = []
        for band in bands(nest):
            if any(isinstance(s, Nest) for s in band.nest.body) or not band.nest.loops:
                continue
            loop = band.nest.loops[-1]
            if loop.kind == "L" and loop.extent in MENU_VECTOR.get(target, ()) and \
                    _unit_stride_writes(band, loop.var) and band.deps().parallel(loop.var) and \
                    not any(l.kind == "V" for l in _loops_around(band, loop.var)):
                found.append(self.action(nest=i, loop=loop.var))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        index, nest, band, loop = _kind_site(self, program, action, "V")
        if loop.extent > MAX_VECTOR:
            raise IllegalActionError(f"loop {loop.var} has {loop.extent} iterations; vectors longer than "
                                     f"{MAX_VECTOR} lanes take too long to compile: split it first")
        _require_parallel(band, loop, "vectorize")
        nested = [l.var for l in _loops_around(band, loop.var) + _loops_inside(band, loop.var) if l.kind == "V"]
        if nested:
            raise IllegalActionError(f"loop {loop.var} is nested with the vectorized loop(s) {nested}")
        return with_nest(program, index, set_kind(nest, band, loop.var, "V"))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loop"])
        loop = band.nest.loop(action["loop"])
        inside = _loops_inside(band, loop.var)
        where = ("it is the innermost loop" if not inside else
                 f"the {len(inside)} loop(s) inside it run within each group of lanes")
        return (f"Vectorized loop {loop.var} of nest {action['nest']} ({loop.extent} iterations): its iterations "
                f"run as SIMD lanes; {where}. Legal: {_legal_fact(band, loop.var)}. Lanes "
                f"{access_pattern(band.nest, loop.var, 'neighbouring lanes')} (adjacent elements load and store "
                f"as whole vectors, strided ones need gathers, reused ones are broadcast). Up to "
                f"{loop.extent} scalar operations become vector operations of the machine's width.")

    def infer(self, before: Program, after: Program) -> list[Action]:
        return [self.action(nest=i, loop=v) for i, v, _ in kind_changes(before, after, "V")]


def _axis_of(loop: Loop) -> str | None:
    return loop.var[:2] if loop.kind == "B" and loop.var[:2] in GPU_AXES else None


def check_axis_limits(nest: Nest, bound: Loop, replaced: tuple[str, ...] = ()) -> None:
    """A loop bound to `bound`'s axis must fit the CUDA limits: its axis unused elsewhere in the nest, its
    extent within the axis limit, and at most 1024 threads per block."""
    axis = _axis_of(bound)
    if axis is None:
        raise IllegalActionError(f"bound loop {bound.var!r} names no GPU axis ({', '.join(GPU_AXES)})")
    others = [l for l in all_loops(nest) if l.var not in replaced and l.var != bound.var]
    if any(_axis_of(l) == axis for l in others):
        raise IllegalActionError(f"GPU axis {axis} is already bound in this nest")
    if bound.extent > AXIS_LIMITS[axis]:
        raise IllegalActionError(f"extent {bound.extent} exceeds the limit {AXIS_LIMITS[axis]} of axis {axis}")
    threads = math.prod(l.extent for l in others + [bound] if (_axis_of(l) or "").startswith("t"))
    if threads > MAX_THREADS:
        raise IllegalActionError(f"the nest would use {threads} threads per block (limit {MAX_THREADS})")


def bound_name(nest: Nest, axis: str, var: str) -> str:
    """The reference's name for loop `var` bound to `axis` (`by` + `a` = `bya`), made unique in the nest."""
    used = {l.var for l in all_loops(nest)}
    name, suffix = axis + var, 0
    while name in used:
        suffix += 1
        name = f"{axis}{var}{suffix}"
    return name


@register
class LoopBinding(Strategy):
    """Bind a serial loop to a CUDA grid axis (L -> B): `axis` is bx/by/bz (blockIdx) or tx/ty/tz
    (threadIdx), and the loop is renamed axis + old name (`bya`), which is how the lowering finds the axis.

    Preconditions: the loop exists in a top-level band and is serial; it carries no dependence; the axis is
    not bound elsewhere in the nest; the extent fits the axis (blockIdx.x < 2^31, y/z <= 65535,
    threadIdx x/y <= 1024, z <= 64) and the nest's threads stay <= 1024. Offered on cuda only."""

    name = "loop_binding"
    params = ("nest", "loop", "axis")
    nest_local = True

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        if target != "cuda":
            return []
        nest = program.nests[i]
        found = []
        band = Band((), (), nest)
        deps = band.deps()
        for loop in nest.loops:
            if loop.kind != "L" or not deps.parallel(loop.var):
                continue
            for family in ("b", "t"):
                axis = self._free_axis(nest, loop, family)
                if axis is not None:
                    found.append(self.action(nest=i, loop=loop.var, axis=axis))
        return found

    def _free_axis(self, nest: Nest, loop: Loop, family: str) -> str | None:
        for axis in GPU_AXES:
            if axis.startswith(family):
                try:
                    check_axis_limits(nest, Loop("B", loop.extent, axis + loop.var), replaced=(loop.var,))
                except IllegalActionError:
                    continue
                return axis
        return None

    def apply(self, program: Program, action: Action) -> Program:
        index, nest, band, loop = _kind_site(self, program, action, "B")
        axis = action["axis"]
        if axis not in GPU_AXES:
            raise IllegalActionError(f"axis must be one of {', '.join(GPU_AXES)}, got {axis!r}")
        if band.path:
            raise IllegalActionError(f"loop {loop.var} belongs to an inner nest; only loops of a top-level nest "
                                     f"can be bound to the grid")
        _require_parallel(band, loop, "bind")
        name = bound_name(nest, axis, loop.var)
        check_axis_limits(nest, Loop("B", loop.extent, name), replaced=(loop.var,))
        return with_nest(program, index, set_kind(nest, band, loop.var, "B", name))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loop"])
        loop = band.nest.loop(action["loop"])
        axis = action["axis"]
        unit = {"b": "blockIdx", "t": "threadIdx"}[axis[0]] + "." + axis[1]
        new_name = bound_name(before.nests[action["nest"]], axis, loop.var)
        role = ("thread blocks, spread over the streaming multiprocessors" if axis[0] == "b" else
                "threads of each block, which run in lockstep warps")
        unit_s = strides(band.nest, loop.var)[0]
        coalesce = (f" Consecutive threads touch consecutive elements of {_names(unit_s)}, so their "
                    f"accesses coalesce." if axis == "tx" and unit_s else "")
        return (f"Bound loop {loop.var} of nest {action['nest']} to {unit}, renaming it {new_name}: its "
                f"{loop.extent} iterations become {loop.extent} {role}, each doing "
                f"{_count(_inner_trip(band, loop.var), 'inner iteration')}. Legal: {_legal_fact(band, loop.var)}; "
                f"the "
                f"axis {axis} was free in this nest and {loop.extent} is within its limit "
                f"{AXIS_LIMITS[axis]}.{coalesce}")

    def infer(self, before: Program, after: Program) -> list[Action]:
        return [self.action(nest=i, loop=v, axis=new[:2]) for i, v, new in kind_changes(before, after, "B")
                if new[:2] in GPU_AXES]
