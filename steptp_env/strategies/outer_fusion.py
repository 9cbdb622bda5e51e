"""`operator_fusion` at a depth: two consecutive nests that share their outer loops merged under those loops
only, each keeping its own inner loops as a nest inside the shared ones (TVM's `compute_at` of a whole
producer at an outer loop of its consumer).

Row-wise operators are the reason: softmax, the norms and attention's score rows are chains of passes over
the same rows (a maximum, a sum of exponentials, a scaled output), each a nest of its own, so every pass
streams all rows through memory again. Merged under the row loop, one row (a few tens of KiB) is produced and
consumed while it is still in the core's caches; the inner loops differ (a reduction, then an elementwise
pass), which is why the classic fusion, which needs identical loops, cannot do it.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import IllegalActionError
from ..ir.analysis import writes
from ..ir.ast import Access, Loop, Nest, Var, all_loops
from .graph_util import describe_loops, map_equation, nest_accesses, substitute
from .util import fresh_loop_var


def loop_key(loop: Loop) -> tuple:
    """What two loops must share to run as one: kind, extent and, for a bound GPU loop, its axis."""
    return loop.kind, loop.extent, loop.var if loop.kind == "B" else ""


def shared_depth(first: Nest, second: Nest) -> int:
    """How many outer loops the two nests have alike (kind, extent and, for bound GPU loops, the axis), up to
    the first vector loop (a vector loop cannot hold other loops)."""
    depth = 0
    for a, b in zip(first.loops, second.loops):
        if a.kind == "V" or loop_key(a) != loop_key(b):
            break
        depth += 1
    return depth


def fuse_under(first: Nest, second: Nest, depth: object) -> Nest:
    """One nest over the first `depth` loops of `first` whose body runs the rest of `first`, then the rest of
    `second` (its loop variables renamed to `first`'s, its inner ones kept apart from `first`'s).

    Legal when every tensor both nests access, with a write on either side, is accessed by every one of those
    accesses with each shared loop variable alone at one fixed subscript position: an iteration of the shared
    loops then touches only its own slice of the tensor, so running `first`'s slice and then `second`'s, slice
    by slice, reads and writes exactly what running all of `first` before all of `second` does.
    IllegalActionError says why not."""
    most = min(len(first.loops), len(second.loops))
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 < depth <= most:
        raise IllegalActionError(f"depth must be between 1 and {most}, got {depth!r}")
    if depth == len(first.loops) == len(second.loops):
        raise IllegalActionError(f"depth {depth} covers every loop of both nests: that is operator_fusion without "
                                 "a depth")
    if shared_depth(first, second) < depth:
        raise IllegalActionError(f"the nests' outer {depth} loops differ or hold a vector loop "
                                 f"({describe_loops(first.loops[:depth])} vs {describe_loops(second.loops[:depth])})")
    second = _renamed(second, first, depth)
    conflict = _slice_conflict(first.loops[:depth], first, second)
    if conflict:
        raise IllegalActionError(f"cannot fuse the nests under their outer {depth} loops: {conflict}")
    return replace(first, loops=first.loops[:depth], body=_inside(first, depth) + _inside(second, depth))


def _inside(nest: Nest, depth: int) -> tuple:
    if len(nest.loops) == depth:
        return nest.body
    return (replace(nest, loops=nest.loops[depth:], trailing=False),)


def _renamed(second: Nest, first: Nest, depth: int) -> Nest:
    """`second` with its outer `depth` loop variables renamed to `first`'s and every inner one that `first`
    also uses given a fresh name, all at once."""
    theirs = {l.var for l in all_loops(first)}
    used = theirs | {l.var for l in all_loops(second)}
    mapping = {b.var: a.var for a, b in zip(first.loops[:depth], second.loops[:depth])}
    outer = set(mapping)
    for loop in all_loops(second):
        if loop.var not in outer and loop.var in theirs and loop.var not in mapping:
            mapping[loop.var] = fresh_loop_var(first, used)
            used.add(mapping[loop.var])
    if all(k == v for k, v in mapping.items()):
        return second
    values = {k: Var(v) for k, v in mapping.items()}

    def rename(nest: Nest) -> Nest:
        loops = tuple(Loop(l.kind, l.extent, mapping.get(l.var, l.var)) for l in nest.loops)
        body = tuple(rename(s) if isinstance(s, Nest) else map_equation(s, lambda e: substitute(e, values))
                     for s in nest.body)
        return replace(nest, loops=loops, body=body)

    return rename(second)


def _slice_conflict(shared: tuple[Loop, ...], first: Nest, second: Nest) -> str | None:
    touched: dict[str, list[Access]] = {}
    for nest in (first, second):
        for acc in nest_accesses(nest):
            touched.setdefault(acc.name, []).append(acc)
    both = {a.name for a in nest_accesses(first)} & {a.name for a in nest_accesses(second)}
    written = set(writes(first)) | set(writes(second))
    for name in sorted(both & written):
        for loop in shared:
            positions = [{p for p, index in enumerate(acc.indices) if isinstance(index, Var) and index.name == loop.var}
                         for acc in touched[name]]
            if not set.intersection(*positions):
                return (f"{name} is not accessed at one subscript position holding {loop.var} alone, so two "
                        f"iterations of {loop.var} can touch the same element")
    return None
