"""Loop strategies that change a loop's kind: unrolling, parallelization, vectorization, binding.

Each turns one serial (L) loop of a band into U, P, V or B; legality comes from the band's carried
dependences, and binding also from the CUDA grid limits (`check_axis_limits`, which `loop_fusion`
checks for a fused bound loop too). A bound loop is renamed axis + old name (`bya` is blockIdx.y), as
the Step-TP reference names it and the lowering reads it.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..errors import IllegalActionError
from ..ir.ast import Loop, Nest, all_loops, equations, rename_var
from ..ir.canonical import AXIS_PREFIXES
from ..ir.program import Program
from .base import Action, Strategy, register
from .loop_deps import affine
from .loop_sites import (Band, access_pattern, band_of, band_pairs, bands, changed_nest, counted, inner_trip,
                         legal_fact, listed, loop_site, map_body, replace_band, strides, trip_count, with_nest)

GPU_AXES = AXIS_PREFIXES
"""Bound-loop name prefixes, as the lowering reads them (`bya` is blockIdx.y)."""
AXIS_LIMITS = {"bx": 2 ** 31 - 1, "by": 65535, "bz": 65535, "tx": 1024, "ty": 1024, "tz": 64}
MAX_THREADS = 1024
"""CUDA's limit on the threads of one block (product of the threadIdx extents of a nest)."""
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
    index, nest, band, loop = loop_site(program, action)
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
    changed = changed_nest(before, after)
    if changed is None:
        return []
    index, b_nest, a_nest = changed
    found = []
    for b, a in band_pairs(b_nest, a_nest):
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
                        loop.extent * inner_trip(band, loop.var, vector_once=True) <= MAX_UNROLL:
                    found.append(self.action(nest=i, loop=loop.var))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        index, nest, band, loop = _kind_site(self, program, action, "U")
        return with_nest(program, index, set_kind(nest, band, loop.var, "U"))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        band = band_of(before.nests[action["nest"]], action["loop"])
        loop = band.nest.loop(action["loop"])
        inside = inner_trip(band, loop.var)
        return (f"Unrolled loop {loop.var} of nest {action['nest']}: its {loop.extent} iterations become "
                f"{loop.extent} straight-line copies of the body (each running "
                f"{counted(inside, 'inner iteration')}). Legal: unrolling runs the same iterations in the same "
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
        outside = trip_count(_loops_around(band, loop.var))
        work = counted(inner_trip(band, loop.var), "inner iteration")
        repeat = f", and the loop is entered {outside} times (once per iteration of the loops around it)"
        return (f"Parallelized loop {loop.var} of nest {action['nest']}: its {loop.extent} iterations are "
                f"shared among CPU threads, each iteration doing {work} of work{repeat if outside > 1 else ''}. "
                f"Legal: {legal_fact(band, loop.var)}. With T threads the loop takes about 1/T of its serial "
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
                f"run as SIMD lanes; {where}. Legal: {legal_fact(band, loop.var)}. Lanes "
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
        coalesce = (f" Consecutive threads touch consecutive elements of {listed(unit_s)}, so their "
                    f"accesses coalesce." if axis == "tx" and unit_s else "")
        return (f"Bound loop {loop.var} of nest {action['nest']} to {unit}, renaming it {new_name}: its "
                f"{loop.extent} iterations become {loop.extent} {role}, each doing "
                f"{counted(inner_trip(band, loop.var), 'inner iteration')}. Legal: {legal_fact(band, loop.var)}; "
                f"the "
                f"axis {axis} was free in this nest and {loop.extent} is within its limit "
                f"{AXIS_LIMITS[axis]}.{coalesce}")

    def infer(self, before: Program, after: Program) -> list[Action]:
        return [self.action(nest=i, loop=v, axis=new[:2]) for i, v, new in kind_changes(before, after, "B")
                if new[:2] in GPU_AXES]
