"""Memory strategies: where intermediate values live, and the helpers every copy-making strategy shares.

set_storage_scope        move an intermediate to global, local or shared memory
precompute_indices       hoist an affine subscript into an int64 index tensor computed by its own nest

(layout_transformation and set_storage_layout live in `layouts.py`, cache_read_write and
reduction_factorization in modules of their own; all of them build on this module's helpers: sites,
access rewriting, copy sources and the rules for new nests.)

New nests (copies, index tensors) follow the reference's form: they are placed right next to the nest they
serve, iterate over the loops whose variables their subscripts use, and in a program bound to the GPU the
first loop of a new nest without a bound loop becomes `B^{N}_{tx}`, as the reference binds dimension 0 of
every nest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..errors import IllegalActionError, SignatureError
from ..ir.analysis import index_range, loop_iterations, reads, writes
from ..ir.ast import (Access, BinOp, Const, Equation, Expr, Loop, Nest, Var, accesses, all_loops, children,
                      equations, free_vars, map_children, replace_accesses)
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .util import fresh_tensor, nest_at

LOCAL_SCOPE_LIMIT_BYTES = 64 * 1024
"""The largest local buffer the CPU lowering keeps local (`steptp_env.lower.tir` has the same limit; it is
not imported here so that the strategies load without TVM)."""

SHARED_MEMORY_BYTES = 48 * 1024
"""Shared memory a CUDA thread block can statically allocate; larger caches stay global."""

MAX_THREADS_PER_BLOCK = 1024
"""CUDA's limit on threads per block: a new nest binds a loop shorter than this, as the reference does."""

SCOPE_NAMES = {"g": "global", "l": "local", "s": "shared"}

# ---------------------------------------------------------------------------------------------------------
# Shared helpers: sites, rewriting, new nests
# ---------------------------------------------------------------------------------------------------------


def _fail(message: str) -> None:
    raise IllegalActionError(message)


def _rebuild(program: Program, nests: list[Nest] | tuple[Nest, ...]) -> Program:
    """The program with new nests; an invalid result is an illegal action, with the validator's reason."""
    try:
        return program.replace_nests(nests)
    except SignatureError as exc:
        raise IllegalActionError(f"the result would not be a valid program: {exc}") from None


def _value_accesses(expr: Expr) -> Iterator[Access]:
    """Accesses read as values, in source order; index tensors inside subscripts are not values."""
    if isinstance(expr, Access):
        yield expr
        return
    for child in children(expr):
        yield from _value_accesses(child)


@dataclass(frozen=True)
class _Site:
    """One access in a nest: the loops around its equation, the access, whether it is the written one."""

    loops: tuple[Loop, ...]
    access: Access
    is_write: bool


def _sites(nest: Nest) -> list[_Site]:
    """Every value access of a nest in source order: each equation's target, then its reads."""
    found = []
    for loops, eq in equations(nest):
        found.append(_Site(loops, eq.lhs, True))
        found.extend(_Site(loops, acc, False) for acc in _value_accesses(eq.rhs))
    return found


def _map_equations(nest: Nest, fn: Callable[[tuple[Loop, ...], Equation], Equation],
                   outer: tuple[Loop, ...] = ()) -> Nest:
    """The nest with every equation replaced by `fn(enclosing loops, equation)`."""
    loops = outer + nest.loops
    body = tuple(_map_equations(s, fn, loops) if isinstance(s, Nest) else fn(loops, s) for s in nest.body)
    return replace(nest, body=body)


def _map_accesses(nest: Nest, fn: Callable[[Access], Expr], binding: dict[str, int] | None = None) -> Nest:
    """Every access of a nest (targets and index tensors included) replaced by `fn(access)`; with `binding`
    (loop variable -> extent), only in equations whose loops bind those variables to those extents (sibling
    inner nests may reuse a variable name with another extent)."""

    def rewrite(loops: tuple[Loop, ...], eq: Equation) -> Equation:
        if binding is not None and _binding(loops, set(binding)) != binding:
            return eq
        return Equation(replace_accesses(eq.lhs, fn), replace_accesses(eq.rhs, fn))

    return _map_equations(nest, rewrite)


def _binding(loops: tuple[Loop, ...], names: set[str]) -> dict[str, int]:
    return {l.var: l.extent for l in loops if l.var in names}


def _site_binding(site: _Site) -> dict[str, int]:
    """The extents of the loops a site's subscripts use."""
    return _binding(site.loops, _vars_of(site.access.indices))


def _substitute(expr: Expr, mapping: dict[str, Expr]) -> Expr:
    if isinstance(expr, Var):
        return mapping.get(expr.name, expr)
    return map_children(expr, lambda k: _substitute(k, mapping))


def _is_gpu(nest: Nest) -> bool:
    return any(loop.kind == "B" for loop in all_loops(nest))


def _bind_first(loops: list[Loop], gpu: bool) -> dict[str, Expr]:
    """In a GPU program, bind a new nest that has no bound loop to threadIdx.x as the reference does: its
    first loop shorter than a thread block's limit (else its first loop) becomes `B^{N}_{tx}`. Returns the
    renaming of that loop's variable to `tx`."""
    if not gpu or not loops or any(l.kind == "B" or l.var == "tx" for l in loops):
        return {}
    pos = next((i for i, l in enumerate(loops) if l.extent < MAX_THREADS_PER_BLOCK), 0)
    old = loops[pos].var
    loops[pos] = Loop("B", loops[pos].extent, "tx")
    return {old: Var("tx")}


def _staging_loops(loops: tuple[Loop, ...], wanted: set[str]) -> list[Loop]:
    """The loops whose variables a new nest needs, in their order; bound loops stay bound, the others
    become serial (the new nest has its own dependences)."""
    return [Loop(l.kind if l.kind == "B" else "L", l.extent, l.var) for l in loops if l.var in wanted]


def _vars_of(indices: tuple[Expr, ...]) -> set[str]:
    return {v for index in indices for v in free_vars(index)}


def _written_before(program: Program, index: int, name: str) -> bool:
    return any(name in writes(nest) for nest in program.nests[:index])


def _shape(program: Program, name: str) -> tuple[int, ...]:
    return program.tensors[name].shape


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    bits = 8 if dtype == "bool" else int("".join(ch for ch in dtype if ch.isdigit()))
    return math.prod(shape) * bits // 8


def _extent_of(indices: tuple[Expr, ...], loops: tuple[Loop, ...]) -> tuple[int, ...] | None:
    """The shape a tensor written at `indices` inside `loops` gets (one past the largest subscript)."""
    bounds = {l.var: l.extent for l in loops}
    dims = []
    for index in indices:
        rng = index_range(index, bounds)
        if rng is None or rng[0] < 0:
            return None
        dims.append(rng[1] + 1)
    return tuple(dims)


def _applies(strategy: Strategy, program: Program, action: Action) -> bool:
    """Whether `action` applies (for menus whose legality depends on the parameters, e.g. a split factor)."""
    try:
        strategy.apply(program, action)
    except IllegalActionError:
        return False
    return True


def _check_tensor_name(value) -> str:
    if not isinstance(value, str):
        _fail(f"tensor must be a tensor name, got {value!r}")
    return value


def _new_tensors(before: Program, after: Program) -> list[str]:
    old = set(before.tensors)
    return [name for name in after.tensors if name not in old]


def _text(expr: Expr) -> str:
    return print_expr(expr)


def _iterations(nest: Nest) -> int:
    return loop_iterations((nest,))


# ---------------------------------------------------------------------------------------------------------
# Copy sources (cache_read_write, layout_transformation)
# ---------------------------------------------------------------------------------------------------------


def _read_site(nest: Nest, tensor: str) -> _Site | None:
    return next((s for s in _sites(nest) if not s.is_write and s.access.name == tensor), None)


def _copy_source(program: Program, n: int, tensor: str) -> tuple[_Site | None, str]:
    """The first value read of `tensor` in nest n that a copy nest placed before it can serve, or None and
    why not: the nest must not write `tensor`, and the subscripts must read no index tensor and stay
    inside `tensor` (a guarded read such as `c-2` under `if_then_else` would be read unguarded)."""
    nest = program.nests[n]
    if tensor not in program.tensors:
        return None, f"no tensor {tensor!r} in the program"
    if tensor in writes(nest):
        return None, f"nest {n} writes {tensor}: a copy made before it would not see those writes"
    site = _read_site(nest, tensor)
    if site is None:
        return None, f"nest {n} does not read {tensor} as a value"
    source = site.access
    if any(True for i in source.indices for _ in accesses(i)):
        return None, f"the subscripts of {_text(source)} read an index tensor"
    reach = _extent_of(source.indices, site.loops)
    if reach is None or any(r > d for r, d in zip(reach, _shape(program, tensor))):
        return None, (f"{_text(source)} can reach outside {tensor} (a guarded read); an unguarded copy "
                      "would read out of bounds")
    return site, ""


# ---------------------------------------------------------------------------------------------------------
# set_storage_scope
# ---------------------------------------------------------------------------------------------------------


@register
class SetStorageScope(Strategy):
    """Move intermediate `tensor` to memory scope `scope` (`g` global, `l` local, `s` shared): every access
    of it names the new scope.

    Preconditions: `tensor` is an intermediate (signature tensors live where the caller put them) and
    `scope` differs from its current one. Scopes never change values. Candidates offer global and local on
    the CPU, and also shared on the GPU.
    """

    name = "set_storage_scope"
    params = ("tensor", "scope")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        menu = ("g", "l", "s") if target == "cuda" else ("g", "l")
        return [self.action(tensor=name, scope=scope)
                for name, info in program.intermediates.items() for scope in menu if scope != info.scope]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        tensor, scope = _check_tensor_name(action["tensor"]), action["scope"]
        _check_intermediate(program, tensor)
        if scope not in SCOPE_NAMES:
            _fail(f"scope must be one of g, l, s; got {scope!r}")
        if program.tensors[tensor].scope == scope:
            _fail(f"{tensor} is already in {SCOPE_NAMES[scope]} memory")
        nests = [_map_accesses(nest, lambda a: replace(a, scope=scope) if a.name == tensor else a)
                 for nest in program.nests]
        return _rebuild(program, nests)

    def explain(self, before: Program, action: Action, after: Program) -> str:
        tensor, scope = action["tensor"], action["scope"]
        info = before.tensors[tensor]
        size = _nbytes(info.shape, info.dtype)
        writers = [i for i, nest in enumerate(before.nests) if tensor in writes(nest)]
        readers = [i for i, nest in enumerate(before.nests) if tensor in reads(nest)]
        effect = {"l": f"on the CPU a local buffer of at most {LOCAL_SCOPE_LIMIT_BYTES} bytes lives on the "
                       "stack (larger ones stay global); on the GPU it is per-thread registers/local memory",
                  "s": "shared memory is on-chip and shared by a thread block, much faster than global memory "
                       f"but limited to about {SHARED_MEMORY_BYTES} bytes per block",
                  "g": "global memory holds any size and is visible to every nest and thread"}[scope]
        return (f"Moved the intermediate {tensor} ({'x'.join(map(str, info.shape)) or 'scalar'} {info.dtype}, "
                f"{size} bytes) from {SCOPE_NAMES[info.scope]} to {SCOPE_NAMES[scope]} memory; it is written "
                f"by nest(s) {_list(writers)} and read by nest(s) {_list(readers)}, and every access now names "
                f"the new scope. Legal because {tensor} is not in the signature and a scope only says where "
                f"the values live, not what they are. Cost: {effect}.")


def _check_intermediate(program: Program, tensor: str) -> None:
    if tensor in program.signature:
        _fail(f"{tensor} is a {program.signature[tensor].role} in the signature; only intermediates can move")
    if tensor not in program.tensors:
        _fail(f"no tensor {tensor!r} in the program")


def _list(items: list[int]) -> str:
    return ", ".join(map(str, items)) if items else "none"


# ---------------------------------------------------------------------------------------------------------
# precompute_indices
# ---------------------------------------------------------------------------------------------------------


def _affine(expr: Expr) -> bool:
    """An integer affine expression of loop variables: sums and differences of variables, integer constants
    and products with a constant factor."""
    if isinstance(expr, Var):
        return True
    if isinstance(expr, Const):
        return expr.is_int
    if isinstance(expr, BinOp):
        if expr.op in ("+", "-"):
            return _affine(expr.lhs) and _affine(expr.rhs)
        if expr.op == "*":
            consts = [isinstance(s, Const) and s.is_int for s in (expr.lhs, expr.rhs)]
            return any(consts) and _affine(expr.lhs) and _affine(expr.rhs)
    return False


def _precomputable(expr: Expr) -> bool:
    """Worth an index tensor: affine, uses a loop variable, and is more than a bare variable."""
    return not isinstance(expr, Var) and bool(free_vars(expr)) and _affine(expr)


def _index_site(nest: Nest, tensor: str, dim) -> _Site | None:
    for site in _sites(nest):
        acc = site.access
        if acc.name == tensor and isinstance(dim, int) and 0 <= dim < acc.rank and _precomputable(acc.indices[dim]):
            return site
    return None


@register
class PrecomputeIndices(Strategy):
    """Hoist subscript `dim` of the first access of `tensor` in nest `nest` (an affine expression such as
    `c-2` or `c*2+d*3`) into a new int64 index tensor, filled by a nest placed just before, over the loops
    the expression uses; every access of the nest with that same subscript expression reads the index
    tensor instead.

    Preconditions: the subscript is affine in loop variables, uses at least one, and is not a bare variable
    (nothing to precompute otherwise). The index tensor holds exactly the values the expression took, so
    reads find the same elements and tensors written through it keep their inferred shape. Only equations
    whose loops give the expression's variables the same extents are rewritten.
    """

    name = "precompute_indices"
    params = ("nest", "tensor", "dim")
    nest_local = True

    def nest_candidates(self, program: Program, n: int, target: str) -> list[Action]:
        found = []
        seen: list[Expr] = []
        for site in _sites(program.nests[n]):
            for dim, index in enumerate(site.access.indices):
                if _precomputable(index) and index not in seen:
                    seen.append(index)
                    action = self.action(nest=n, tensor=site.access.name, dim=dim)
                    if _applies(self, program, action):
                        found.append(action)
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        n, tensor, dim = action["nest"], _check_tensor_name(action["tensor"]), action["dim"]
        nest = nest_at(program, n)
        if not any(s.access.name == tensor for s in _sites(nest)):
            _fail(f"nest {n} does not access {tensor}")
        site = _index_site(nest, tensor, dim)
        if site is None:
            _fail(f"no access of {tensor} in nest {n} has an affine, non-trivial subscript {dim!r} to precompute")
        expr = site.access.indices[dim]
        index_name = fresh_tensor(program)
        used = free_vars(expr)
        loops = _staging_loops(site.loops, set(used))
        order = [l.var for l in loops]
        rename = _bind_first(loops, _is_gpu(nest))
        index_read = Access(index_name, "int64", "g", tuple(Var(v) for v in order))
        write = Equation(Access(index_name, "int64", "g", tuple(_substitute(Var(v), rename) for v in order)),
                         _substitute(expr, rename))
        fill = Nest(tuple(loops), (write,))
        staged = _map_accesses(nest, lambda a: replace(a, indices=tuple(index_read if i == expr else i
                                                                          for i in a.indices)),
                               _binding(site.loops, set(used)))
        return _rebuild(program, list(program.nests[:n]) + [fill, staged] + list(program.nests[n + 1:]))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        n, tensor, dim = action["nest"], action["tensor"], action["dim"]
        site = _index_site(before.nests[n], tensor, dim)
        expr = site.access.indices[dim]
        fill = after.nests[n]
        index_name = fill.body[0].lhs.name
        uses = sum(1 for s in _sites(before.nests[n]) for i in s.access.indices if i == expr)
        bounds = {l.var: l.extent for l in site.loops}
        lo, hi = index_range(expr, bounds)
        return (f"Precomputed the subscript {_text(expr)} of {tensor} in nest {n} into the int64 index "
                f"tensor {index_name} ({'x'.join(map(str, after.tensors[index_name].shape))}), filled by the new "
                f"nest {n} in {_iterations(fill)} iteration(s) with values {lo}..{hi}; the {uses} subscript(s) "
                f"of nest {n + 1} that computed it now read {_text(fill.body[0].lhs)} with the loop "
                f"variables {', '.join(free_vars(expr))}. Legal because the expression depends only on those "
                f"loop variables, so the table holds exactly the values it took. Nest {n + 1} runs "
                f"{_iterations(after.nests[n + 1])} iterations, each replacing index arithmetic by one load; "
                f"this helps when the arithmetic is costlier than the load or the table is reused.")



__all__ = ["SetStorageScope", "PrecomputeIndices"]
