"""Dependence analysis of one loop band, the legality test behind the loop strategies.

A *band* is the loop tuple of one (possibly inner) nest; the loops around it are *fixed* (same iteration on
both ends of a dependence) and loops inside it are unknowns. For every pair of accesses to a tensor the band
body writes, we compute the distance between the two iterations that touch the same element, per band
variable: 0, a constant, or unknown. A variable with a non-zero or unknown distance *carries* the
dependence. Dependences of a reduction on itself (`X=X+e` read and written at the same element) only fix
the order of accumulation, so the variables that carry them may be reordered freely (float rounding aside,
which verification tolerates); every other carried variable is *ordered*: the relative order of ordered
loops must be kept, and an ordered or reduced loop may not run its iterations in parallel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..ir.analysis import reduction, scans
from ..ir.ast import Access, BinOp, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses

UNKNOWN = None
"""Distance of a variable the subscripts do not determine."""


def affine(expr: Expr) -> tuple[dict[str, int], int] | None:
    """(coefficients by loop var, constant) when `expr` is an integer affine form, else None."""
    if isinstance(expr, Const):
        return ({}, expr.value) if expr.is_int else None
    if isinstance(expr, Var):
        return {expr.name: 1}, 0
    if isinstance(expr, Neg):
        inner = affine(expr.operand)
        return None if inner is None else ({v: -c for v, c in inner[0].items()}, -inner[1])
    if isinstance(expr, BinOp) and expr.op in ("+", "-", "*"):
        lhs, rhs = affine(expr.lhs), affine(expr.rhs)
        if lhs is None or rhs is None:
            return None
        if expr.op == "*":
            if lhs[0] and rhs[0]:
                return None
            (coeffs, const), scale = (lhs, rhs[1]) if lhs[0] else (rhs, lhs[1])
            return {v: c * scale for v, c in coeffs.items()}, const * scale
        sign = 1 if expr.op == "+" else -1
        coeffs = dict(lhs[0])
        for v, c in rhs[0].items():
            coeffs[v] = coeffs.get(v, 0) + sign * c
        return {v: c for v, c in coeffs.items() if c}, lhs[1] + sign * rhs[1]
    return None


def injective(coeffs: dict[str, int], extents: dict[str, int]) -> bool:
    """True when sum(c_v * v) takes a different value for every point of the loop box (mixed radix)."""
    span = 0
    for var in sorted(coeffs, key=lambda v: (abs(coeffs[v]), v)):
        if abs(coeffs[var]) <= span:
            return False
        span += abs(coeffs[var]) * (extents[var] - 1)
    return True


def distance(write: Access, other: Access, band: dict[str, int], fixed: set[str]) -> dict[str, int | None] | None:
    """Per band variable, iteration(write) - iteration(other) for two instances touching the same element
    within one iteration of the fixed loops; None when they never do. Subscripts that are not affine, or
    mention loops inside the band, give no information (the distances they involve stay unknown); a loop
    of one iteration has distance 0."""
    known: dict[str, int] = {}
    for w_index, o_index in zip(write.indices, other.indices):
        w, o = affine(w_index), affine(o_index)
        if w is None or o is None or any(v not in band and v not in fixed for v in (*w[0], *o[0])):
            continue
        if any(w[0].get(v, 0) != o[0].get(v, 0) for v in fixed):
            continue
        coeffs = {v: c for v, c in w[0].items() if v in band}
        if coeffs != {v: c for v, c in o[0].items() if v in band}:
            continue
        gap = o[1] - w[1]
        if not coeffs:
            if gap:
                return None
            continue
        if len(coeffs) == 1:
            (var, coeff), = coeffs.items()
            if gap % coeff:
                return None
            found = gap // coeff
            if abs(found) >= band[var] or known.get(var, found) != found:
                return None
            known[var] = found
        elif gap == 0 and injective(coeffs, band):
            for var in coeffs:
                if known.get(var, 0) != 0:
                    return None
                known[var] = 0
    return {var: 0 if band[var] == 1 else known.get(var, UNKNOWN) for var in band}


@dataclass(frozen=True)
class BandDependences:
    """What may be done with the loops of one band.

    `ordered`: vars whose relative order must be kept, with the reasons; `reduced`: vars that carry only
    reduction dependences (reorderable, not parallel)."""

    band: tuple[str, ...]
    ordered: dict[str, tuple[str, ...]]
    reduced: dict[str, tuple[str, ...]]

    def parallel(self, var: str) -> bool:
        """Iterations of `var` are independent: no dependence of any kind is carried by it."""
        return var not in self.ordered and var not in self.reduced

    def reasons(self, var: str) -> tuple[str, ...]:
        return self.ordered.get(var, ()) + self.reduced.get(var, ())

    def order_kept(self, order: tuple[str, ...]) -> bool:
        """A permutation of the band is legal when the ordered loops keep their relative order."""
        kept = [v for v in order if v in self.ordered]
        return kept == [v for v in self.band if v in self.ordered]


def _all_accesses(eq: Equation) -> Iterator[tuple[bool, Access]]:
    """(is the store, access) for the store and every read of an equation, index tensors included."""
    yield True, eq.lhs
    for index in eq.lhs.indices:
        yield from ((False, acc) for acc in accesses(index))
    yield from ((False, acc) for acc in accesses(eq.rhs))


def _statements(nest: Nest, outer: tuple[Loop, ...]) -> list[tuple[tuple[Loop, ...], Equation]]:
    found = []
    for stmt in nest.body:
        if isinstance(stmt, Nest):
            found.extend(_statements(stmt, outer + stmt.loops))
        else:
            found.append((outer, stmt))
    return found


def band_dependences(band_nest: Nest, enclosing: tuple[Loop, ...] = ()) -> BandDependences:
    """Dependences carried by the loops of `band_nest` (an inner nest is analysed with the loops around it
    in `enclosing`)."""
    band = {l.var: l.extent for l in band_nest.loops}
    fixed = {l.var for l in enclosing}
    stmts = _statements(band_nest, enclosing + band_nest.loops)
    ordered: dict[str, list[str]] = {}
    reduced: dict[str, list[str]] = {}

    def note(table: dict[str, list[str]], var: str, why: str) -> None:
        reasons = table.setdefault(var, [])
        if why not in reasons:
            reasons.append(why)

    for w, (loops, writer) in enumerate(stmts):
        red = reduction(loops, writer)
        scanned = {s.var for s in scans(loops, writer)}
        for o, (_, other_eq) in enumerate(stmts):
            for is_store, other in _all_accesses(other_eq):
                if other.name != writer.lhs.name or other.rank != writer.lhs.rank:
                    continue
                dist = distance(writer.lhs, other, band, fixed)
                if dist is None:
                    continue
                carried = [v for v in band_nest.loop_vars if dist[v] != 0]
                self_use = o == w and other == writer.lhs
                for var in carried:
                    if self_use and red is not None:
                        note(reduced, var, f"reduction into {writer.lhs.name}")
                    elif self_use and is_store:
                        note(ordered, var, f"{writer.lhs.name} is overwritten at one element in several iterations")
                    elif var in scanned and o == w:
                        note(ordered, var, f"prefix scan of {writer.lhs.name}")
                    else:
                        note(ordered, var, f"{writer.lhs.name} is written in one iteration and used in another")
    return BandDependences(band_nest.loop_vars, {v: tuple(r) for v, r in ordered.items()},
                           {v: tuple(r) for v, r in reduced.items() if v not in ordered})
