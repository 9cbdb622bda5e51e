"""cache_read_write: stage a nest's reads of a tensor, or its writes, through a cache tensor.

Three forms, one strategy:
- `mode=read`: a copy nest before the nest fills the cache; the nest reads the cache.
- `mode=write`: the nest computes into the cache; a copy nest after it stores the result.
- `mode=write, at=X`: a *local accumulator*. Inside loop X of the nest, the loops below X run into a cache
  tile and an inner copy nest, still inside X, stores the tile to the tensor. The cache keeps the tensor's
  subscripts, so LEIR's reduction rule (a reduction starts from its identity before its outermost reduced
  loop) restarts the tile in every iteration of X, and TVM allocates it where all its accesses meet (inside
  X, `PlanAndUpdateBufferAllocationLocation`) with only the elements one iteration touches
  (`CompactBufferAllocation`): a matmul's 1x16 output row segment becomes one vector register that the k
  loop updates, instead of a load and a store of the output per multiply-add.

The text names the loop, so a stored runtime always says where the accumulator lives:
`cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=g)`.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir.analysis import iteration_span, writes
from ..ir.ast import Access, Equation, Loop, Nest, Var, accesses, all_loops
from ..ir.program import Program
from .base import Action, Strategy, register
from .memory import (LOCAL_SCOPE_LIMIT_BYTES, SCOPE_NAMES, SHARED_MEMORY_BYTES, _bind_first, _check_tensor_name,
                     _copy_source, _extent_of, _fail, _is_gpu, _iterations, _map_accesses, _nbytes, _new_tensors,
                     _read_site, _rebuild, _Site, _site_binding, _sites, _staging_loops, _substitute, _text, _vars_of,
                     _written_before)
from .util import fresh_loop_var, fresh_tensor, nest_at

WHOLE_PARAMS = ("nest", "tensor", "mode", "scope")
AT_PARAMS = ("nest", "tensor", "mode", "scope", "at")
TILE_SCOPE_LIMITS = {"l": LOCAL_SCOPE_LIMIT_BYTES, "s": SHARED_MEMORY_BYTES}
"""The scopes a tile inside a loop may take and their size limits (a global tile would be allocated anew
in every iteration of the loop)."""


def _scope_menu(nbytes: int | None, target: str) -> str:
    """The scope a new cache gets: local on the CPU (registers/stack) and shared on the GPU when it is small
    enough, else global."""
    small = nbytes is not None
    if target == "cuda":
        return "s" if small and nbytes <= SHARED_MEMORY_BYTES else "g"
    return "l" if small and nbytes <= LOCAL_SCOPE_LIMIT_BYTES else "g"


def _first_write(nest: Nest, tensor: str) -> _Site | None:
    return next((s for s in _sites(nest) if s.is_write and s.access.name == tensor), None)


def _write_cache_site(program: Program, n: int, tensor: str) -> str | None:
    """Why the writes of `tensor` in nest n cannot go through a cache (None when they can)."""
    nest = program.nests[n]
    written_at = [s for s in _sites(nest) if s.is_write and s.access.name == tensor]
    if not written_at:
        return f"nest {n} does not write {tensor}"
    spans = {(s.access, tuple(sorted(_site_binding(s).items()))) for s in written_at}
    if len(spans) > 1:
        return (f"nest {n} writes {tensor} at {len(spans)} different subscripts or loop extents; one copy-out "
                "cannot cover them")
    if _written_before(program, n, tensor):
        return f"{tensor} is written before nest {n}; a fresh cache would lose those values"
    if any(True for i in written_at[0].access.indices for _ in accesses(i)):
        return f"the subscripts of {tensor} in nest {n} read an index tensor"
    return None


def tile_shape(site: _Site, depth: int) -> tuple[int, ...] | None:
    """The shape of a tile holding the elements of the written access that one iteration of the first
    `depth` loops around it touches (`iteration_span`, counted from 0), or None when a subscript's range is
    unknown or negative."""
    spans = iteration_span(site.access.indices, site.loops, depth)
    if spans is None or any(low < 0 for low, _ in spans):
        return None
    return tuple(high + 1 for _, high in spans)


def _accumulator_refusal(program: Program, n: int, tensor: str, at, scope: str) -> str | None:
    """Why the writes of `tensor` in nest n cannot accumulate in a `scope` tile inside loop `at` (None when
    they can)."""
    return _tile_tensor_refusal(program, n, tensor) or _tile_loop_refusal(program, n, tensor, at, scope)


def _tile_tensor_refusal(program: Program, n: int, tensor: str) -> str | None:
    """What rules out a tile of `tensor` in nest n at any loop: its writes cannot go through a cache, or
    the nest also accesses it elsewhere than where it writes it (the tile holds only those elements)."""
    reason = _write_cache_site(program, n, tensor)
    if reason is not None:
        return reason
    nest = program.nests[n]
    site = _first_write(nest, tensor)
    other = sorted({_text(s.access) for s in _sites(nest) if s.access.name == tensor
                    and (s.access != site.access or _site_binding(s) != _site_binding(site))})
    if other:
        return (f"nest {n} also accesses {tensor} as {', '.join(other)}, not only at {_text(site.access)}: a "
                f"tile holds only the elements one iteration writes")
    return None


def _tile_loop_refusal(program: Program, n: int, tensor: str, at, scope: str) -> str | None:
    """What rules out a tile of `tensor` inside loop `at` of nest n, given the tensor allows one."""
    nest = program.nests[n]
    if at not in nest.loop_vars:
        return (f"at must name one of nest {n}'s own loops ({', '.join(nest.loop_vars)}), got {at!r}: the tile "
                "lives inside that loop")
    if scope not in TILE_SCOPE_LIMITS:
        return (f"a tile inside loop {at} lives in local or shared memory (scope l or s), not {scope!r}; the "
                "form without `at` caches the whole result in global memory")
    pos = nest.loop_vars.index(at)
    site = _first_write(nest, tensor)
    used = _vars_of(site.access.indices)
    outside = nest.loops[:pos + 1]
    reducing = [l.var for l in outside if l.var not in used]
    if reducing:
        return (f"loop(s) {', '.join(reducing)} at or outside {at} do not index {tensor}: they reduce into it, "
                f"and a tile inside them would restart the reduction (move them inside {at} first)")
    vector = [l.var for l in outside if l.kind == "V"]
    if vector:
        return f"loop(s) {', '.join(vector)} at or outside {at} are vector loops; a tile goes inside serial loops"
    inside = [l for l in all_loops(nest) if l not in outside]
    if any(l.kind == "B" for l in inside):
        return f"nest {n} binds a GPU axis inside loop {at}; the tile would be shared by the threads"
    if not [l for l in site.loops[pos + 1:] if l.var not in used]:
        return (f"no loop inside {at} reduces into {tensor}: each element is written once per iteration of "
                f"{at}, so a tile would only add a copy")
    shape = tile_shape(site, pos + 1)
    if shape is None:
        return f"the extent of {_text(site.access)} inside loop {at} is unknown"
    size = _nbytes(shape, site.access.dtype)
    if size > TILE_SCOPE_LIMITS[scope]:
        return (f"the tile of {tensor} inside loop {at} needs {size} bytes, more than the "
                f"{TILE_SCOPE_LIMITS[scope]} bytes a {SCOPE_NAMES[scope]} buffer may take")
    return None


@register
class CacheReadWrite(Strategy):
    """Stage accesses of `tensor` in nest `nest` through a new cache tensor in scope `scope`.

    `mode=read`: a copy nest placed just before the nest copies `tensor` at the subscripts of its first read
    there (over the loops those subscripts use) and every read at those subscripts reads the cache instead.
    Preconditions: the nest reads `tensor` as a value and does not write it (so the copy sees the values the
    nest would read); the subscripts hold no index tensor and stay inside `tensor` for every iteration (a
    read guarded by `if_then_else`, like a padding's `c-2`, would be copied unguarded).
    `mode=write`: the nest computes into the cache and a copy nest placed just after it copies the result
    out. Preconditions: every equation of the nest that writes `tensor` writes the same subscripts, and no
    earlier nest writes `tensor` (the cache starts where the tensor started: fresh).
    `mode=write, at=X` (X one of the nest's own loops): the loops below X and the body become an inner nest
    writing the cache, followed inside X by a copy nest (fresh loop names, vector and unrolled kinds kept)
    that stores the tile to `tensor`. Preconditions, besides those of `mode=write`: every loop at or outside
    X indexes `tensor` (none reduces into it, so each iteration of X owns its elements), none of them is a
    vector loop, no GPU axis is bound inside X, some loop inside X reduces into `tensor` (else there is
    nothing to accumulate), every access of `tensor` in the nest uses the written subscript (the tile holds
    nothing else), and the tile fits the scope: at most LOCAL_SCOPE_LIMIT_BYTES local, SHARED_MEMORY_BYTES
    shared; `g` is refused.
    Scopes: `g`, `l`, `s`; candidates offer local memory on the CPU and shared memory on the GPU when the
    cache is small enough, global memory otherwise; then, on the CPU, after every form without `at`, a local
    tile at each loop where one applies (nests in order, loops outer to inner). (On the GPU `at` applies
    but is not offered: a thread's tile belongs inside its bound loops, which the menu does not yet model.)
    """

    name = "cache_read_write"
    params = WHOLE_PARAMS
    alternative_params = AT_PARAMS

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for n, nest in enumerate(program.nests):
            for tensor, mode in self._sites(program, n):
                size = self._cache_bytes(program, n, tensor, mode)
                found.append(self.action(nest=n, tensor=tensor, mode=mode, scope=_scope_menu(size, target)))
        for n, nest in enumerate(program.nests if target == "llvm" else ()):
            for tensor in writes(nest):
                if _tile_tensor_refusal(program, n, tensor) is None:  # the loop-independent checks, once
                    found.extend(self.action(nest=n, tensor=tensor, mode="write", scope="l", at=loop.var)
                                 for loop in nest.loops
                                 if _tile_loop_refusal(program, n, tensor, loop.var, "l") is None)
        return found

    @staticmethod
    def _sites(program: Program, n: int) -> list[tuple[str, str]]:
        """(tensor, mode) of every cacheable read and write of nest n, in source order."""
        nest = program.nests[n]
        reads_ = [(name, "read") for name in dict.fromkeys(s.access.name for s in _sites(nest) if not s.is_write)
                  if _copy_source(program, n, name)[0]]
        return reads_ + [(name, "write") for name in writes(nest) if _write_cache_site(program, n, name) is None]

    @staticmethod
    def _cache_bytes(program: Program, n: int, tensor: str, mode: str) -> int | None:
        site = _read_site(program.nests[n], tensor) if mode == "read" else _first_write(program.nests[n], tensor)
        shape = _extent_of(site.access.indices, site.loops)
        return None if shape is None else _nbytes(shape, program.tensors[tensor].dtype)

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        n, tensor, mode, scope = action["nest"], action["tensor"], action["mode"], action["scope"]
        nest = nest_at(program, n)
        _check_tensor_name(tensor)
        if scope not in SCOPE_NAMES:
            _fail(f"scope must be one of g, l, s; got {scope!r}")
        if tensor not in program.tensors:
            _fail(f"no tensor {tensor!r} in the program")
        if mode not in ("read", "write"):
            _fail(f"mode must be read or write, got {mode!r}")
        cache = fresh_tensor(program)
        at = action.get("at")
        if at is not None:
            if mode != "write":
                _fail("`at` places an accumulator tile: it takes mode=write")
            return self._cache_write_at(program, n, nest, tensor, cache, scope, at)
        if mode == "read":
            return self._cache_read(program, n, nest, tensor, cache, scope)
        return self._cache_write(program, n, nest, tensor, cache, scope)

    @staticmethod
    def _cache_read(program: Program, n: int, nest: Nest, tensor: str, cache: str, scope: str) -> Program:
        site, reason = _copy_source(program, n, tensor)
        if site is None:
            _fail(reason)
        source = site.access
        loops = _staging_loops(site.loops, _vars_of(source.indices))
        rename = _bind_first(loops, _is_gpu(nest))
        copy_src = _substitute(source, rename)
        copy = Nest(tuple(loops), (Equation(Access(cache, source.dtype, scope, copy_src.indices), copy_src),))
        staged = _map_accesses(nest, lambda a: replace(a, name=cache, scope=scope) if a == source else a,
                               _site_binding(site))
        return _rebuild(program, list(program.nests[:n]) + [copy, staged] + list(program.nests[n + 1:]))

    @staticmethod
    def _cache_write(program: Program, n: int, nest: Nest, tensor: str, cache: str, scope: str) -> Program:
        reason = _write_cache_site(program, n, tensor)
        if reason is not None:
            _fail(reason)
        site = _first_write(nest, tensor)
        target = site.access
        staged = _map_accesses(nest, lambda a: replace(a, name=cache, scope=scope) if a.name == tensor else a)
        loops = _staging_loops(site.loops, _vars_of(target.indices))
        rename = _bind_first(loops, _is_gpu(nest))
        out = _substitute(target, rename)
        copy = Nest(tuple(loops), (Equation(out, replace(out, name=cache, scope=scope)),))
        return _rebuild(program, list(program.nests[:n]) + [staged, copy] + list(program.nests[n + 1:]))

    @staticmethod
    def _cache_write_at(program: Program, n: int, nest: Nest, tensor: str, cache: str, scope: str, at) -> Program:
        reason = _accumulator_refusal(program, n, tensor, at, scope)
        if reason is not None:
            _fail(reason)
        pos = nest.loop_vars.index(at)
        target = _first_write(nest, tensor).access
        inner = _map_accesses(Nest(nest.loops[pos + 1:], nest.body),
                              lambda a: replace(a, name=cache, scope=scope) if a.name == tensor else a)
        used = _vars_of(target.indices)
        copy_loops, rename, taken = [], {}, set()
        for loop in all_loops(inner):
            if loop.var in used and loop.var not in rename:
                var = fresh_loop_var(nest, taken)
                taken.add(var)
                rename[loop.var] = Var(var)
                copy_loops.append(Loop(loop.kind if loop.kind in ("V", "U") else "L", loop.extent, var))
        out = _substitute(target, rename)
        store = Equation(out, replace(out, name=cache, scope=scope))
        copy = Nest(tuple(copy_loops), (store,)) if copy_loops else store
        body = (inner,) if inner.loops else inner.body  # at the innermost loop: no loopless group (LEIR has none)
        tiled = Nest(nest.loops[:pos + 1], (*body, copy))
        return _rebuild(program, list(program.nests[:n]) + [tiled] + list(program.nests[n + 1:]))

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The reference caches in local memory whatever the size: take the scope from the new tensor."""
        scopes = sorted({after.tensors[t].scope for t in _new_tensors(before, after)})
        return [self.action(nest=n, tensor=t, mode=m, scope=s)
                for n in range(len(before.nests)) for t, m in self._sites(before, n) for s in scopes]

    def explain(self, before: Program, action: Action, after: Program) -> str:
        n, tensor, mode, scope = action["nest"], action["tensor"], action["mode"], action["scope"]
        cache = _new_tensors(before, after)[0]
        info = after.tensors[cache]
        size = _nbytes(info.shape, info.dtype)
        where = SCOPE_NAMES[scope]
        if action.get("at") is not None:
            return self._explain_at(before, n, tensor, cache, where, action["at"])
        if mode == "read":
            site = _read_site(before.nests[n], tensor)
            copy_nest, user = after.nests[n], after.nests[n + 1]
            reads_count = sum(1 for s in _sites(user) if s.access.name == cache)
            reuse = _iterations(user) / max(1, math.prod(info.shape))
            return (f"Staged the reads of {_text(site.access)} in nest {n} through the cache {cache} "
                    f"({'x'.join(map(str, info.shape)) or 'scalar'}, {size} bytes, {where} memory): the new "
                    f"nest {n} copies it in {_iterations(copy_nest)} iteration(s) and nest {n + 1} reads the "
                    f"cache at {reads_count} place(s) instead of {tensor}. Legal because nest {n} reads "
                    f"{tensor} but does not write it and the subscripts stay inside {tensor}, so the copy "
                    f"holds exactly the values it would read. Nest {n + 1} runs {_iterations(user)} iterations "
                    f"over {math.prod(info.shape)} cached element(s), about {reuse:.3g} reads per element, now "
                    f"from {where} memory: the copy pays off when that reuse is high and {where} memory is "
                    f"faster than where {tensor} lives.")
        copy_nest, nest = after.nests[n + 1], before.nests[n]
        per_element = _iterations(nest) / max(1, math.prod(info.shape))
        gain = (f"nest {n} writes each element about {per_element:.3g} times, now in {where} memory, and "
                f"{tensor} is written once per element" if per_element > 1 else
                f"nest {n} writes each element once, so the cache only pays off as a staging step for later "
                f"transformations of nest {n}")
        return (f"Redirected the writes of {tensor} in nest {n} to the cache {cache} "
                f"({'x'.join(map(str, info.shape)) or 'scalar'}, {size} bytes, {where} memory) and added nest "
                f"{n + 1}, which copies the result out to {tensor} in {_iterations(copy_nest)} iteration(s). "
                f"Legal because no earlier nest writes {tensor}, so the cache starts from the same state, and "
                f"every write of {tensor} in nest {n} uses the same subscripts, which the copy-out covers. "
                f"Cost: {gain}.")

    @staticmethod
    def _explain_at(before: Program, n: int, tensor: str, cache: str, where: str, at: str) -> str:
        nest = before.nests[n]
        pos = nest.loop_vars.index(at)
        site = _first_write(nest, tensor)
        used = _vars_of(site.access.indices)
        shape = tile_shape(site, pos + 1)
        elements = math.prod(shape)
        reduced = [l.var for l in site.loops[pos + 1:] if l.var not in used]
        updates = _iterations(nest) // max(1, math.prod(l.extent for l in nest.loops[:pos + 1]) * elements)
        return (f"Kept the accumulation of {tensor} in nest {n} in a {where} tile {cache} inside loop {at}: "
                f"{'x'.join(map(str, shape))} element(s), {_nbytes(shape, site.access.dtype)} bytes. In every "
                f"iteration of loop(s) {', '.join(nest.loop_vars[:pos + 1])} the tile starts from the "
                f"reduction's identity, loop(s) {', '.join(reduced)} accumulate into it (about {updates} updates "
                f"per element), and a copy nest inside {at} then stores it to {tensor} once. Legal because every "
                f"loop at or outside {at} indexes {tensor}, so each iteration owns the elements it writes, every "
                f"access of {tensor} in the nest uses the written subscript, and no earlier nest writes "
                f"{tensor}. Cost: one store of {tensor} per element instead of a load and a store per update; "
                f"small tiles stay in registers.")
