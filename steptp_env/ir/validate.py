"""Checks a program against its signature and infers the shapes of intermediates.

Each problem raises a `SignatureError` whose `kind` says what is wrong and whose `tensor` names the tensor
(or loop variable): undefined-name, rank-mismatch, read-before-write, out-of-bounds, dtype-mismatch,
scope-mismatch, inconsistent-shape, writes-input, output-not-written, duplicate-loop-var, unknown-shape.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SignatureError
from .analysis import index_range
from .ast import Access, Const, Neg, Nest, Var, accesses, equations, walk
from .dtypes import is_int
from .program import Signature, TensorInfo


def _constant(expr) -> int | None:
    """The value of an integer literal subscript (`3`, `-1`), else None."""
    if isinstance(expr, Neg):
        inner = _constant(expr.operand)
        return None if inner is None else -inner
    return expr.value if isinstance(expr, Const) and expr.is_int else None


def check_program(nests: tuple[Nest, ...], signature: Signature) -> dict[str, TensorInfo]:
    """Validate `nests` against `signature`; return every tensor's info (intermediate shapes inferred)."""
    known = {s.name: s for s in signature.tensors}
    meta: dict[str, tuple[str, str, int, str]] = {}  # name -> (dtype, scope, rank, 'write'/'read')
    extents: dict[str, list[int]] = {}  # intermediate -> inferred extent per dimension
    written: set[str] = set()
    constant_reads: list[tuple[int, Access]] = []
    value_ranges: dict[str, tuple[int, int]] = {}  # integer intermediate -> range of the values written

    for n, nest in enumerate(nests):
        summary = _nest_summary(nest)
        for i, (eq, bounds, lhs_accesses, rhs_reads, index_reads, ranges) in enumerate(summary.equations):
            if summary.error is not None and summary.error[0] == i:
                raise SignatureError(*summary.error[1:], n)
            _check_access(eq.lhs, known, meta, n, is_write=True)
            for acc in lhs_accesses + rhs_reads:
                _check_access(acc, known, meta, n, is_write=False)
            for acc in rhs_reads + index_reads:
                if acc.name not in written and acc.name not in summary.writes and acc.name != eq.lhs.name:
                    spec = known.get(acc.name)
                    if spec is None or spec.role == "output":
                        raise SignatureError("read-before-write", f"{acc.name} is read before it is written",
                                             acc.name, n)
                if any(_constant(i) is not None for i in acc.indices):
                    constant_reads.append((n, acc))
            _check_write(eq.lhs, bounds, ranges, known, extents, value_ranges, n)
            written.add(eq.lhs.name)
            if eq.lhs.name not in known and is_int(eq.lhs.dtype):
                _note_value_range(eq, bounds, value_ranges)

    for spec in signature.outputs:
        if spec.name not in written:
            raise SignatureError("output-not-written", f"output {spec.name} is never written", spec.name)
    for n, acc in constant_reads:
        shape = known[acc.name].shape if acc.name in known else tuple(extents[acc.name])
        for dim, index in enumerate(acc.indices):
            value = _constant(index)
            if value is not None and not 0 <= value < shape[dim]:
                raise SignatureError("out-of-bounds", f"{acc.name} has extent {shape[dim]} in dimension {dim}, "
                                     f"subscript {value} is outside", acc.name, n)

    infos = {}
    for spec in signature.tensors:
        dtype, scope, *_ = meta.get(spec.name, (spec.dtype, "g"))
        infos[spec.name] = TensorInfo(spec.name, spec.shape, spec.dtype, scope, spec.role)
    for name, dims in extents.items():
        dtype, scope, *_ = meta[name]
        infos[name] = TensorInfo(name, tuple(dims), dtype, scope, "intermediate")
    return infos


@dataclass(frozen=True)
class _NestSummary:
    """What validation needs from one nest on its own, computed once per nest object: nests are shared
    between a program and the programs the strategies derive from it, so only changed nests pay."""

    writes: frozenset[str]
    equations: tuple  # (equation, loop extents, accesses(lhs), accesses(rhs), accesses in the lhs subscripts,
    #                    ranges of the lhs subscripts or None)
    error: tuple | None  # (equation number, kind, message, name) of the first unbound or twice-bound variable


_SUMMARIES: dict[int, tuple[Nest, _NestSummary]] = {}


def _nest_summary(nest: Nest) -> _NestSummary:
    hit = _SUMMARIES.get(id(nest))
    if hit is not None and hit[0] is nest:
        return hit[1]
    if len(_SUMMARIES) >= 8192:
        _SUMMARIES.clear()
    summary = _summarise(nest)
    _SUMMARIES[id(nest)] = (nest, summary)  # holding the nest keeps its id from being reused
    return summary


def _summarise(nest: Nest) -> _NestSummary:
    eqs, error = [], None
    for i, (loops, eq) in enumerate(equations(nest)):
        names = [l.var for l in loops]
        bounds = {l.var: l.extent for l in loops}
        unbound = [node.name for expr in (eq.rhs, *eq.lhs.indices)
                   for node in walk(expr) if isinstance(node, Var) and node.name not in bounds]
        twice = [var for var in names if names.count(var) > 1]
        if error is None and twice:
            error = (i, "duplicate-loop-var", f"loop variable {twice[0]!r} is bound twice", twice[0])
        if error is None and unbound:
            error = (i, "undefined-name", f"loop variable {unbound[0]!r} is not bound here", unbound[0])
        index_reads = tuple(a for index in eq.lhs.indices for a in accesses(index))
        # the write's subscript ranges, unless they go through index tensors (whose values vary by program)
        ranges = None if index_reads else tuple(index_range(index, bounds, {}) for index in eq.lhs.indices)
        eqs.append((eq, bounds, tuple(accesses(eq.lhs)), tuple(accesses(eq.rhs)), index_reads, ranges))
    writes = frozenset(eq.lhs.name for eq, *_ in eqs)
    return _NestSummary(writes, tuple(eqs), error)


def _note_value_range(eq, bounds, value_ranges) -> None:
    """Track the values an integer intermediate can hold, so writes through it (precomputed indices) can
    be bounded. A tensor some write of which cannot be bounded is dropped for good."""
    new = index_range(eq.rhs, bounds, value_ranges)
    name = eq.lhs.name
    if new is None:
        value_ranges[name] = None  # type: ignore[assignment]
    elif name not in value_ranges:
        value_ranges[name] = new
    elif value_ranges[name] is not None:
        old = value_ranges[name]
        value_ranges[name] = (min(old[0], new[0]), max(old[1], new[1]))


def _check_access(acc: Access, known, meta, n: int, is_write: bool) -> None:
    """The writes of an intermediate fix its storage (dtype and scope); they must all agree. A read of an
    intermediate may name another dtype, which converts the value read, and another scope, which is
    ignored (the reference writes `R^{f64,s}=16` and reads `R^{i32,g}`). Signature tensors must be accessed
    with their signature dtype. Ranks must always agree."""
    spec = known.get(acc.name)
    if spec is not None:
        if acc.dtype != spec.dtype:
            raise SignatureError("dtype-mismatch", f"{acc.name} is {spec.dtype} in the signature but accessed as "
                                 f"{acc.dtype}", acc.name, n)
        if acc.rank != len(spec.shape):
            raise SignatureError("rank-mismatch", f"{acc.name} has rank {len(spec.shape)} but is accessed with "
                                 f"{acc.rank} subscript(s)", acc.name, n)
    if is_write and acc.name in meta and meta[acc.name][3] == "read":
        meta[acc.name] = (acc.dtype, acc.scope, acc.rank, "write")
    seen = meta.setdefault(acc.name, (acc.dtype, acc.scope, acc.rank, "write" if is_write else "read"))
    strict = is_write or spec is not None
    if seen[0] != acc.dtype and strict:
        raise SignatureError("dtype-mismatch", f"{acc.name} is accessed both as {seen[0]} and {acc.dtype}",
                             acc.name, n)
    if seen[1] != acc.scope and is_write:
        raise SignatureError("scope-mismatch", f"{acc.name} is accessed in scopes {seen[1]!r} and {acc.scope!r}",
                             acc.name, n)
    if seen[2] != acc.rank:
        raise SignatureError("inconsistent-shape", f"{acc.name} is accessed with {seen[2]} and {acc.rank} "
                             "subscripts", acc.name, n)


def _check_write(lhs: Access, bounds: dict[str, int], local_ranges, known, extents, value_ranges, n: int) -> None:
    spec = known.get(lhs.name)
    if spec is not None and spec.role != "output":
        raise SignatureError("writes-input", f"{lhs.name} is a {spec.role} of the program and may not be written",
                             lhs.name, n)
    dims = extents.setdefault(lhs.name, [0] * lhs.rank) if spec is None else None
    for dim, index in enumerate(lhs.indices):
        lo_hi = local_ranges[dim] if local_ranges is not None else \
            index_range(index, bounds, {k: v for k, v in value_ranges.items() if v is not None})
        if lo_hi is None:
            raise SignatureError("unknown-shape", f"cannot bound subscript {dim} of the write to {lhs.name}",
                                 lhs.name, n)
        lo, hi = lo_hi
        limit = spec.shape[dim] if spec is not None else None
        if lo < 0 or (limit is not None and hi >= limit):
            raise SignatureError("out-of-bounds", f"write to {lhs.name} reaches [{lo}, {hi}] in dimension {dim}"
                                 + (f" of extent {limit}" if limit is not None else ""), lhs.name, n)
        if dims is not None:
            dims[dim] = max(dims[dim], hi + 1)
