"""Graph-level strategies: they move work between nests (fusion, fission, inlining, splitting an expression or
a tensor, concatenating two operators, common subexpressions, dead code, statement order) without changing
what any output holds.

Legality comes from the use-def chains and the per-iteration access analysis of `graph_util`, never from the
text. Where the reference writes a transformation in a fixed shape (copy nests that keep the loops of the
nest they feed, a hoisted nest bound to threadIdx.x on GPU programs), the result has that shape so that
`identify` recognises the reference's rows; its known bugs are not reproduced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import IllegalActionError
from ..ir.analysis import Reduction, element_positions, index_range, reads, reduction, scans, users, writes
from ..ir.ast import (Access, BinOp, Call, Compare, Const, Equation, Expr, Loop, Nest, Var, accesses, children,
                      equations, free_vars, map_children, replace_accesses)
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (MAX_THREADS, Path, affine_in, bounds_of, compute_nest, describe_loops, exact_index_value,
                         flat_equations, float_valued, in_bounds, injective_subscript, is_compound,
                         loops_with_extent, map_equation, map_nest_with_loops, mentions, nest_accesses, node_at,
                         ranges_apart, replace_at, safe_everywhere, same_iteration_conflict, shift_var, substitute,
                         trip_count, under_branch, unique_value_subscripts, value_accesses, value_paths, with_scope)
from .outer_fusion import fuse_under, loop_key, shared_depth
from .util import fresh_tensor, int_param, is_intermediate, nest_at

SCOPE_NAMES = {"g": "global memory", "s": "shared memory", "l": "local memory (registers)"}


# -- shared checks -----------------------------------------------------------------------------------------------

def _flat(program: Program, index) -> tuple[Nest, list[Equation]]:
    nest = nest_at(program, index)
    eqs = flat_equations(nest)
    if eqs is None:
        raise IllegalActionError(f"nest {index} holds an inner nest; this strategy works on flat nests only")
    return nest, eqs


def _single(program: Program, index) -> tuple[Nest, Equation]:
    nest, eqs = _flat(program, index)
    if len(eqs) != 1:
        raise IllegalActionError(f"nest {index} has {len(eqs)} equations; this strategy needs exactly one")
    return nest, eqs[0]


def _names_param(action: Action, key: str) -> tuple[str, ...]:
    value = action[key]
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise IllegalActionError(f"{key} must be a list of names, got {value!r}")
    if len(set(value)) != len(value):
        raise IllegalActionError(f"{key} names {list(value)} repeat")
    return value


def _reads_own_target(eq: Equation) -> bool:
    return any(a.name == eq.lhs.name for a in accesses(eq.rhs))


def _legal(check):
    """`check` made quiet: its result, or None where it raises IllegalActionError (for candidates)."""
    def probe(*args):
        try:
            return check(*args)
        except IllegalActionError:
            return None
    return probe


def _holds(check, *args) -> bool:
    """True when `check(*args)` raises no IllegalActionError."""
    try:
        check(*args)
    except IllegalActionError:
        return False
    return True


# -- operator_fusion / operator_fission ----------------------------------------------------------------------------

def _private_tensors(program: Program, nests: tuple[Nest, ...], index: int) -> list[str]:
    """Intermediates that every nest but `index` leaves alone and that nest `index` accesses at one
    subscript giving each iteration its own element: they can live in per-thread or per-block storage."""
    nest = nests[index]
    elsewhere = {a.name for j, n in enumerate(nests) if j != index for a in nest_accesses(n)}
    subscripts: dict[str, set] = {}
    for acc in nest_accesses(nest):
        subscripts.setdefault(acc.name, set()).add(acc.indices)
    return [name for name, subs in subscripts.items()
            if is_intermediate(program, name) and name not in elsewhere and len(subs) == 1
            and injective_subscript(next(iter(subs)), nest.loops)]


@register
class OperatorFusion(Strategy):
    """Merge nest `nest` and the nest after it into one nest whose body runs both equations per iteration.

    Preconditions: both nests are flat and have the same loops (kinds and extents, and the same GPU axes for
    bound loops; the second nest's other loop variables are renamed to the first's); every tensor the two
    share with a write on either side is accessed at one subscript giving each iteration its own element, so
    no iteration needs a value computed by another iteration and no reduction is read before it is complete.
    `scope` is the storage of the intermediates that afterwards live only inside the fused nest: `g` global,
    `s` shared or `l` local (s and l are offered for CUDA only).

    With `depth`, the two nests are merged under their first `depth` loops only, each keeping its other
    loops as an inner nest (`outer_fusion.fuse_under`): the nests may differ below those loops and hold inner
    nests, and every tensor they share with a write is touched by each iteration of the shared loops at its
    own slice. The menu offers, for each pair the classic form cannot fuse, the deepest such depth."""

    name = "operator_fusion"
    params = ("nest", "scope")
    alternative_params = ("nest", "scope", "depth")

    def site(self, program: Program, index, depth=None) -> tuple[Nest, list[str]]:
        nest_at(program, index)
        if index + 1 >= len(program.nests):
            raise IllegalActionError(f"nest {index} is the last nest: there is nothing to fuse it with")
        if depth is not None:
            fused = fuse_under(nest_at(program, index), nest_at(program, index + 1), depth)
            nests = program.nests[:index] + (fused,) + program.nests[index + 2:]
            return fused, _private_tensors(program, nests, index)
        first, eqs1 = _flat(program, index)
        second, eqs2 = _flat(program, index + 1)
        if [loop_key(l) for l in first.loops] != [loop_key(l) for l in second.loops]:
            raise IllegalActionError(f"nests {index} and {index + 1} have different loops "
                                     f"({describe_loops(first.loops)} vs {describe_loops(second.loops)})")
        rename = {b.var: Var(a.var) for a, b in zip(first.loops, second.loops) if a.var != b.var}
        eqs2 = [map_equation(eq, lambda e: substitute(e, rename)) for eq in eqs2]
        conflict = same_iteration_conflict(first.loops, eqs1, eqs2)
        if conflict:
            raise IllegalActionError(f"cannot fuse nests {index} and {index + 1}: {conflict}")
        fused = replace(first, body=tuple(eqs1 + eqs2))
        nests = program.nests[:index] + (fused,) + program.nests[index + 2:]
        return fused, _private_tensors(program, nests, index)

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests) - 1):
            site = _legal(self.site)(program, i)
            if site is None:
                depth = self._deepest(program, i)
                if depth:
                    found.append(self.action(nest=i, scope="g", depth=depth))
                continue
            found.append(self.action(nest=i, scope="g"))
            if target == "cuda" and site[1]:
                found += [self.action(nest=i, scope="s"), self.action(nest=i, scope="l")]
        return found

    def _deepest(self, program: Program, index: int) -> int | None:
        """The deepest depth the pair can be fused at (legality only shrinks with depth), or None."""
        first, second = program.nests[index], program.nests[index + 1]
        for depth in range(shared_depth(first, second), 0, -1):
            if _legal(self.site)(program, index, depth) is not None:
                return depth
        return None

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index, scope = int_param(action, "nest"), action["scope"]
        if scope not in SCOPE_NAMES:
            raise IllegalActionError(f"scope must be one of g, s, l; got {scope!r}")
        fused, private = self.site(program, index, action.get("depth"))
        if private:
            fused = with_scope(fused, {name: program.tensors[name].dtype for name in private}, scope)
        return program.replace_nests(program.nests[:index] + (fused,) + program.nests[index + 2:])

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i = action["nest"]
        if action.get("depth") is not None:
            return self._explain_under(before, i, after.nests[i].loops)
        loops = before.nests[i].loops
        shared = sorted(set(writes(before.nests[i])) & set(reads(before.nests[i + 1])))
        flow = (f"{', '.join(shared)} is written and read at the same element in the same iteration, so no "
                "iteration needs a value that another iteration produces" if shared else
                "the two nests share no written tensor, so their iterations are independent")
        _, private = self.site(before, i)
        where = (f" {', '.join(private)} now lives only inside the fused nest and is kept in "
                 f"{SCOPE_NAMES[action['scope']]}." if private else "")
        return (f"operator_fusion merged nest {i} and nest {i + 1}, which run the same loops "
                f"({describe_loops(loops)}), into one nest whose body computes both equations. It is legal "
                f"because {flow}.{where} One pass of {trip_count(loops)} iterations replaces two, and each value "
                "passes to its consumer while it is still in a register or cache instead of through memory.")

    @staticmethod
    def _explain_under(before: Program, i: int, shared: tuple[Loop, ...]) -> str:
        flowing = sorted(set(writes(before.nests[i])) & set(reads(before.nests[i + 1])))
        verb = "passes" if len(flowing) == 1 else "pass"
        flow = (f"{', '.join(flowing)} {verb} from the first to the second" if flowing
                else "the two share no written tensor")
        return (f"operator_fusion merged nest {i} and nest {i + 1} under their common outer loops "
                f"({describe_loops(shared)}): each iteration now runs the first nest's inner loops, then the "
                f"second's. It is legal because {flow}, and every tensor the two share with a write is accessed "
                "at a subscript holding each shared loop variable alone, so an iteration touches only its own "
                "slice and finishing one slice before the next changes no value. Each slice is produced and "
                "consumed while it is still in cache instead of streaming the whole tensor through memory twice.")


@register
class OperatorFission(Strategy):
    """Split the body of nest `nest` before statement `at` into two nests over the same loops.

    Preconditions: the nest is flat and has more than one equation; every tensor the two parts share with a
    write on either side is accessed at one subscript giving each iteration its own element, so running the
    first part to completion before the second changes no value (no reduction is read unfinished). Tensors
    kept in shared or local memory that both parts access move to global memory, since they now cross
    nests."""

    name = "operator_fission"
    params = ("nest", "at")

    def site(self, program: Program, index, at) -> tuple[Nest, Nest]:
        nest, eqs = _flat(program, index)
        if len(eqs) < 2:
            raise IllegalActionError(f"nest {index} has a single equation: there is nothing to split")
        if not isinstance(at, int) or not 0 < at < len(eqs):
            raise IllegalActionError(f"at must be between 1 and {len(eqs) - 1}, got {at!r}")
        conflict = same_iteration_conflict(nest.loops, eqs[:at], eqs[at:])
        if conflict:
            raise IllegalActionError(f"cannot split nest {index} before equation {at}: {conflict}")
        first, second = replace(nest, body=tuple(eqs[:at])), replace(nest, body=tuple(eqs[at:]))
        both = {a.name for a in nest_accesses(first)} & {a.name for a in nest_accesses(second)}
        stored = {name: program.tensors[name].dtype for name in both if program.tensors[name].scope != "g"}
        return with_scope(first, stored, "g"), with_scope(second, stored, "g")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i, nest in enumerate(program.nests):
            eqs = flat_equations(nest) or []
            found += [self.action(nest=i, at=k) for k in range(1, len(eqs)) if _legal(self.site)(program, i, k)]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        first, second = self.site(program, index, action["at"])
        return program.replace_nests(program.nests[:index] + (first, second) + program.nests[index + 1:])

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, at = action["nest"], action["at"]
        nest = before.nests[i]
        one, two = after.nests[i], after.nests[i + 1]
        return (f"operator_fission split nest {i} ({describe_loops(nest.loops)}) before its equation {at}: "
                f"{', '.join(writes(one))} and {', '.join(writes(two))} are now computed by two nests over the "
                "same loops. It is legal because no equation of the second part reads a value the first part "
                "produces in another iteration (shared tensors are touched at one element per iteration), so "
                "finishing the first part before starting the second changes nothing. Each nest now has a "
                f"smaller body ({len(one.body)} and {len(two.body)} equations) that can be scheduled, "
                f"parallelized or vectorized on its own, at the cost of a second pass of {trip_count(nest.loops)} "
                "iterations.")


# -- compute_inline ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Producer:
    """An elementwise single-equation nest whose target can be replaced by its expression."""

    equation: Equation
    loops: tuple[Loop, ...]

    def value_at(self, read: Access, loops: tuple[Loop, ...]) -> Expr | None:
        """The producer's expression at the element `read` names from inside `loops`, or None when the
        iteration that wrote it cannot be recovered. Plain loop subscripts map the producer's variables to
        the read's subscripts; a read at the very subscript of the write (`a*8+c`), inside loops of the same
        extents, keeps the variables as they are. Loops of one iteration that the write does not use are 0."""
        write = self.equation.lhs.indices
        mapping: dict[str, Expr] = {l.var: Const(0) for l in self.loops if l.extent == 1}
        if all(isinstance(i, Var) for i in write):
            mapping.update({i.name: e for i, e in zip(write, read.indices)})
        else:
            producer, consumer = bounds_of(self.loops), bounds_of(loops)
            used = {v for i in write for v in free_vars(i)}
            if read.indices != write or any(producer[v] != consumer.get(v) for v in used):
                return None
            mapping = {v: e for v, e in mapping.items() if v not in used}
        value = substitute(self.equation.rhs, mapping)
        return replace(value, parens=value.parens + 1) if _needs_parens(value) else value


def _needs_parens(expr: Expr) -> bool:
    """The reference parenthesizes an inlined expression unless it is a leaf or a call with plain
    arguments (`max(E,0)` stays bare, `min(max(F,0),1)` and `1-D` are wrapped)."""
    if isinstance(expr, (Access, Const, Var)):
        return False
    if isinstance(expr, Call):
        return any("(" in print_expr(a) for a in expr.args)
    return True


def _producer(program: Program, index) -> _Producer:
    nest, eq = _single(program, index)
    name = eq.lhs.name
    if not is_intermediate(program, name):
        raise IllegalActionError(f"{name} is a signature tensor: only intermediates are inlined")
    if any(name in writes(n) for j, n in enumerate(program.nests) if j != index):
        raise IllegalActionError(f"{name} is also written by other nests")
    if _reads_own_target(eq):
        raise IllegalActionError(f"{name} is a reduction, scan or update (it reads itself), not elementwise")
    if not injective_subscript(eq.lhs.indices, nest.loops):
        raise IllegalActionError(f"{name} is not written one element per iteration")
    if not float_valued(eq.rhs, eq.lhs.dtype):
        raise IllegalActionError(f"the value of {name} is converted when stored (its expression is not of its "
                                 f"dtype {eq.lhs.dtype}); inlining would skip the rounding")
    return _Producer(eq, nest.loops)


def _inline_conflict(program: Program, index: int, consumer, producer: _Producer) -> str | None:
    """Why nest `consumer` cannot take the producer's expression in place of its reads, or None."""
    name = producer.equation.lhs.name
    if not isinstance(consumer, int) or not index < consumer < len(program.nests):
        return f"consumer must be a later nest index (after {index}), got {consumer!r}"
    readers = [(loops, eq) for loops, eq in equations(program.nests[consumer])
               if any(a.name == name for a in value_accesses(eq.rhs))]
    if not readers:
        return f"nest {consumer} does not read {name} as a value"
    if any(acc.name == name for _, eq in equations(program.nests[consumer])
           for acc in (*accesses(eq.lhs), *(a for v in value_accesses(eq.rhs) for i in v.indices
                                            for a in accesses(i)))):
        return f"nest {consumer} uses {name} as an index tensor"
    dtype = producer.equation.lhs.dtype
    for loops, eq in readers:
        reads_here = [a for a in value_accesses(eq.rhs) if a.name == name]
        if eq.lhs.dtype != dtype or any(a.dtype != dtype for a in reads_here):
            return f"nest {consumer} converts {name} to another dtype"
        if any(producer.value_at(a, loops) is None for a in reads_here):
            return f"nest {consumer} reads {name} at elements whose producing iteration cannot be recovered"
    inputs = set(reads(program.nests[index]))
    for j in range(index + 1, consumer + 1):
        clobbered = inputs & set(writes(program.nests[j]))
        if clobbered:
            return f"nest {j} overwrites {', '.join(sorted(clobbered))}, which {name}'s expression reads"
    return None


@register
class ComputeInline(Strategy):
    """Replace the reads of an intermediate in nest `consumer` by the expression that defines it in nest
    `nest`, and drop the producer nest once nothing reads the intermediate any more.

    Preconditions: the producer nest is flat with one equation that writes an intermediate no other nest
    writes, one element per iteration, without reading itself (no reduction, scan or update) and without a
    dtype conversion; every read in the consumer names an element whose producing iteration is known (the
    producer's loop variables are replaced by the read's subscripts, rebuilding the expression tree, or the
    read repeats the write's subscript over loops of the same extents); no nest from the producer to the
    consumer overwrites a tensor the expression reads; the consumer reads the intermediate as a value, at its
    own dtype, in equations of that dtype."""

    name = "compute_inline"
    params = ("nest", "consumer")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests)):
            producer = _legal(_producer)(program, i)
            if producer is None:
                continue
            found += [self.action(nest=i, consumer=j) for j in users(program.nests, i)
                      if _inline_conflict(program, i, j, producer) is None]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index, consumer = int_param(action, "nest"), action["consumer"]
        producer = _producer(program, index)
        conflict = _inline_conflict(program, index, consumer, producer)
        if conflict:
            raise IllegalActionError(conflict)
        name = producer.equation.lhs.name

        def inline(loops: tuple[Loop, ...], eq: Equation) -> Equation:
            def swap(acc: Access) -> Expr:
                return producer.value_at(acc, loops) if acc.name == name else acc
            return Equation(eq.lhs, replace_accesses(eq.rhs, swap))

        nests = list(program.nests)
        nests[consumer] = map_nest_with_loops(nests[consumer], inline)
        if not any(name in reads(n) for j, n in enumerate(nests) if j != index):
            del nests[index]
        return program.replace_nests(nests)

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, j = action["nest"], action["consumer"]
        eq = flat_equations(before.nests[i])[0]
        name = eq.lhs.name
        dropped = len(after.nests) < len(before.nests)
        fate = (f"Nothing else reads {name}, so its nest ({trip_count(before.nests[i].loops)} iterations) and its "
                f"buffer of {_elements(before, name)} elements are gone." if dropped else
                f"Other nests still read {name}, so its nest stays.")
        return (f"compute_inline replaced the reads of {name} in nest {j} by its defining expression "
                f"{print_expr(eq.rhs)} from nest {i}, with the producer's loop variables replaced by the "
                f"consumer's subscripts. It is legal because {name} is computed elementwise (one element per "
                "iteration, no reduction or scan) and no nest in between overwrites what the expression reads, "
                f"so recomputing it where it is used gives the same value. {fate} The consumer avoids a round "
                "trip through memory for every element it reads.")


def _elements(program: Program, name: str) -> int:
    return math.prod(program.tensors[name].shape)


# -- expression_splitting -------------------------------------------------------------------------------------------

def _split_term(program: Program, nest: Nest, eqs: list[Equation], term) -> tuple[int, Path, Expr]:
    """(equation, path inside its right-hand side, sub-expression) of a term that can go into its own nest."""
    if not isinstance(term, tuple) or not term or not all(isinstance(t, int) for t in term):
        raise IllegalActionError(f"term must be [equation, path...], got {term!r}")
    e, path = term[0], term[1:]
    if not 0 <= e < len(eqs):
        raise IllegalActionError(f"the nest has {len(eqs)} equations, not {e + 1}")
    eq = eqs[e]
    if path not in set(value_paths(eq.rhs)):
        raise IllegalActionError(f"term path {list(path)} is not a value of the right-hand side")
    node = node_at(eq.rhs, path)
    reason = _hoist_problem(program, nest, node, eq, under_branch(eq.rhs, path))
    if reason:
        raise IllegalActionError(f"cannot split out {print_expr(node)}: {reason}")
    return e, path, node


def _hoist_problem(program: Program, nest: Nest, node: Expr, eq: Equation, guarded: bool) -> str | None:
    """Why `node`, a value in `eq`, cannot be stored (at `eq`'s dtype) by a nest placed before `nest`."""
    dtype = eq.lhs.dtype
    if not is_compound(node):
        return "it is a single leaf"
    if not _storable(node, eq, nest):
        return f"its value is not exactly representable as {dtype} (another type, or a conversion), so storing " \
               "it would change it"
    touched = {a.name for a in value_accesses(node)} & set(writes(nest))
    if touched:
        return f"it reads {', '.join(sorted(touched))}, which the nest itself writes"
    if guarded and not safe_everywhere(program, node, bounds_of(nest.loops)):
        return "it is evaluated only under a condition and would read outside a tensor elsewhere"
    return None


def _storable(node: Expr, eq: Equation, nest: Nest) -> bool:
    """True when storing `node` as `eq`'s dtype and reading it back gives the value `eq` computes with: it is
    of that float dtype already, or it is loop-index arithmetic (`min(2,128-c*2)`) whose every value fits the
    mantissa in an equation that reads floats of that dtype only (so the integer is converted to it
    anyway)."""
    dtype = eq.lhs.dtype
    if float_valued(node, dtype):
        return True
    return is_float(dtype) and exact_index_value(node, dtype, bounds_of(nest.loops)) and all(
        a.dtype == dtype for a in value_accesses(eq.rhs) if is_float(a.dtype))


def _vars_in_loop_order(nest: Nest, node: Expr) -> tuple[str, ...]:
    used = set(free_vars(node))
    return tuple(l.var for l in nest.loops if l.var in used)


@register
class ExpressionSplitting(Strategy):
    """Move a sub-expression (`term`: equation index, then the path of child positions inside its right-hand
    side) of nest `nest` into a new nest placed just before it, which stores it into a fresh intermediate
    subscripted by `dims` and loops over `loops`; the original equation reads the intermediate instead.

    Preconditions: the nest is flat; the term is an operation (not a leaf) outside any subscript, evaluates to
    the equation's float dtype without conversion, reads no tensor the nest writes, and is safe to evaluate at
    every iteration (when it sits under a condition, every read stays inside its tensor); `dims` and `loops`
    both list exactly the loop variables the term uses, so the new nest ranges over those loops only (a term
    that does not depend on a loop is computed once, not once per iteration)."""

    name = "expression_splitting"
    params = ("nest", "term", "dims", "loops")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i, nest in enumerate(program.nests):
            eqs = flat_equations(nest)
            for e, eq in enumerate(eqs or []):
                for path in value_paths(eq.rhs):
                    node = node_at(eq.rhs, path)
                    if _hoist_problem(program, nest, node, eq, under_branch(eq.rhs, path)) is None:
                        order = _vars_in_loop_order(nest, node)
                        found.append(self.action(nest=i, term=(e,) + path, dims=order, loops=order))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        nest, eqs = _flat(program, index)
        e, path, node = _split_term(program, nest, eqs, action["term"])
        dims, order = _names_param(action, "dims"), _names_param(action, "loops")
        used = set(_vars_in_loop_order(nest, node))
        for key, names in (("dims", dims), ("loops", order)):
            if set(names) != used:
                raise IllegalActionError(f"{key} must list the loop variables the term uses "
                                         f"({', '.join(sorted(used)) or 'none'}), got {list(names)}")
        name = fresh_tensor(program)
        target = Access(name, eqs[e].lhs.dtype, "g", tuple(Var(d) for d in dims))
        new = compute_nest(nest, node, target, dims, order)
        eqs[e] = Equation(eqs[e].lhs, replace_at(eqs[e].rhs, path, target))
        rest = replace(nest, body=tuple(eqs))
        return program.replace_nests(program.nests[:index] + (new, rest) + program.nests[index + 1:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Read the term, the subscript order and the loop order of the new intermediate off `after`."""
        found = []
        if len(after.nests) != len(before.nests) + 1:
            return found
        for i in range(len(before.nests)):
            if after.nests[:i] != before.nests[:i] or after.nests[i + 2:] != before.nests[i + 1:]:
                continue
            action = self._read_split(before, after, i)
            if action is not None:
                found.append(action)
        return found

    def _read_split(self, before: Program, after: Program, i: int) -> Action | None:
        new, rest = after.nests[i], after.nests[i + 1]
        new_eqs, rest_eqs = flat_equations(new), flat_equations(rest)
        if not new_eqs or len(new_eqs) != 1 or not rest_eqs or new_eqs[0].lhs.name in before.tensors:
            return None
        name = new_eqs[0].lhs.name
        for e, eq in enumerate(rest_eqs):
            for path in value_paths(eq.rhs):
                node = node_at(eq.rhs, path)
                if isinstance(node, Access) and node.name == name and all(isinstance(x, Var) for x in node.indices):
                    dims = tuple(x.name for x in node.indices)
                    back = {w.name: d for w, d in zip(new_eqs[0].lhs.indices, dims) if isinstance(w, Var)}
                    order = tuple(back[l.var] for l in new.loops if l.var in back)
                    return self.action(nest=i, term=(e,) + path, dims=dims, loops=order)
        return None

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i = action["nest"]
        nest = before.nests[i]
        e, path = action["term"][0], action["term"][1:]
        node = node_at(flat_equations(nest)[e].rhs, path)
        new = after.nests[i]
        name = flat_equations(new)[0].lhs.name
        hoisted = trip_count(new.loops) < trip_count(nest.loops)
        cost = (f"It depends only on {describe_loops(new.loops)}, so it is computed {trip_count(new.loops)} times "
                f"instead of {trip_count(nest.loops)}." if hoisted else
                f"Both nests run {trip_count(nest.loops)} iterations; each body is simpler to vectorize and "
                "schedule, at the cost of storing and reloading the intermediate.")
        return (f"expression_splitting moved {print_expr(node)} out of nest {i} into a new nest that stores it "
                f"in {name} (subscripted by {', '.join(action['dims']) or 'nothing'}); the equation now reads "
                f"{name}. It is legal because the term reads no tensor the nest writes and is safe to evaluate "
                f"at every iteration, so computing it first gives the same values. {cost}")


# -- expression_reorder ----------------------------------------------------------------------------------------------

def _disjoint_writes(first: Nest, second: Nest, name: str) -> bool:
    """True when the two nests write provably different elements of `name` (some dimension's ranges do
    not overlap)."""
    def writes_(nest: Nest) -> list[tuple[Access, dict[str, int]]]:
        return [(eq.lhs, bounds_of(loops)) for loops, eq in equations(nest) if eq.lhs.name == name]

    return all(ranges_apart(*one, *two) for one in writes_(first) for two in writes_(second))


@register
class ExpressionReorder(Strategy):
    """Swap nest `nest` with the nest after it (the reference's statement reordering).

    Preconditions: neither nest reads a tensor the other writes, and tensors both write are written at
    provably disjoint elements, so the order of the two nests cannot change any value."""

    name = "expression_reorder"
    params = ("nest",)

    def site(self, program: Program, index) -> None:
        first = nest_at(program, index)
        if index + 1 >= len(program.nests):
            raise IllegalActionError(f"nest {index} is the last nest: there is nothing to swap it with")
        second = program.nests[index + 1]
        for label, names in ((f"reads what nest {index} writes", set(writes(first)) & set(reads(second))),
                             (f"writes what nest {index} reads", set(reads(first)) & set(writes(second)))):
            if names:
                raise IllegalActionError(f"nest {index + 1} {label} ({', '.join(sorted(names))})")
        for name in sorted(set(writes(first)) & set(writes(second))):
            if not _disjoint_writes(first, second, name):
                raise IllegalActionError(f"both nests may write the same elements of {name}")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        return [self.action(nest=i) for i in range(len(program.nests) - 1) if _holds(self.site, program, i)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        self.site(program, index)
        nests = list(program.nests)
        nests[index], nests[index + 1] = nests[index + 1], nests[index]
        return program.replace_nests(nests)

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i = action["nest"]
        one, two = before.nests[i], before.nests[i + 1]
        return (f"expression_reorder swapped nest {i} (writes {', '.join(writes(one))}) with nest {i + 1} (writes "
                f"{', '.join(writes(two))}). It is legal because neither reads what the other writes and any "
                "tensor both write is written at disjoint elements, so the order is free. The swap changes no "
                "arithmetic, only locality: it can bring a producer next to its consumer (so that the two can be "
                "fused) or nests reading the same data next to each other, while that data is still in cache.")


# -- copies shared by tensor_split and tensor_concat -----------------------------------------------------------------

def _copy_nest(loops: tuple[Loop, ...], eqs: list[Equation]) -> Nest:
    """The reference's copy nest: the loops of the nest it feeds; a GPU-bound loop no copy uses runs once,
    and an unused parallel or vectorized loop becomes serial (it rewrites the same elements)."""
    used = {v for eq in eqs for i in eq.lhs.indices for v in free_vars(i)}
    fixed = []
    for loop in loops:
        if loop.var not in used and loop.kind == "B":
            loop = replace(loop, extent=1)
        elif loop.var not in used and loop.kind in ("P", "V"):
            loop = replace(loop, kind="L")
        fixed.append(loop)
    return Nest(tuple(fixed), tuple(eqs))


def _shift_access(acc: Access, var: str, offset: int) -> Access:
    return replace(acc, indices=tuple(shift_var(i, var, offset) for i in acc.indices))


def _copyable(program: Program, acc: Access, var: str, bounds: dict[str, int]) -> bool:
    """An operand can be copied part by part: its subscript moves with `var` by a constant per step and
    stays inside the tensor at every iteration."""
    return mentions(acc, var) and affine_in(acc, var) and in_bounds(program, acc, bounds)


# -- tensor_split_to_decouple_operators ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _SplitPlan:
    nest: Nest
    equation: Equation
    var: str
    extent: int
    reduction: Reduction | None
    spatial: bool
    copyable: tuple[str, ...]


def _split_plan(program: Program, index, var) -> _SplitPlan:
    nest, eq = _single(program, index)
    if not any(l.var == var for l in nest.loops):
        raise IllegalActionError(f"no loop {var!r} in nest {index} (loops: {', '.join(nest.loop_vars)})")
    loop = nest.loop(var)
    if loop.extent < 2:
        raise IllegalActionError(f"loop {var} runs {loop.extent} iteration: there is nothing to split")
    red = reduction(nest.loops, eq)
    if scans(nest.loops, eq) or (_reads_own_target(eq) and red is None):
        raise IllegalActionError(f"{eq.lhs.name} reads itself outside a reduction (an update or a scan)")
    spatial = var in {v for i in eq.lhs.indices for v in free_vars(i)}
    if red is not None and var in red.reduced_vars:
        if not set(red.reduced_vars) - {var} and any(eq.lhs.name in writes(n) for n in program.nests[:index]):
            raise IllegalActionError(f"{eq.lhs.name} is written before the reduction; combining partial results "
                                     "would add to that value")
    elif not spatial:
        raise IllegalActionError(f"{eq.lhs.name} is rewritten in every iteration of {var}")
    elif not affine_in(eq.lhs, var):
        raise IllegalActionError(f"{eq.lhs.name}'s subscript is not affine in {var}")
    bounds = bounds_of(nest.loops)
    copyable = []
    for name, subs in unique_value_subscripts(eq.rhs).items():
        if name == eq.lhs.name or len(subs) != 1:
            continue
        acc = next(a for a in value_accesses(eq.rhs) if a.name == name)
        if _copyable(program, acc, var, bounds):
            copyable.append(name)
    return _SplitPlan(nest, eq, var, loop.extent, red, var not in (red.reduced_vars if red else ()), tuple(copyable))


def _partial_indices(plan: _SplitPlan) -> tuple[Expr, ...]:
    """Subscript of the partial results: the target's, plus the reduced loops other than the split one so
    that the combining nest still reduces over them (in loop order when the target uses plain subscripts)."""
    eq = plan.equation
    others = [v for v in (plan.reduction.reduced_vars if plan.reduction else ()) if v != plan.var]
    if plan.spatial or not others:
        return eq.lhs.indices
    if all(isinstance(i, Var) for i in eq.lhs.indices):
        kept = {i.name for i in eq.lhs.indices} | set(others)
        return tuple(Var(l.var) for l in plan.nest.loops if l.var in kept)
    return eq.lhs.indices + tuple(Var(v) for v in others)


def _combine(op: str, target: Access, parts: tuple[Access, Access]) -> Expr:
    if op in ("max", "min"):
        return Call(op, (target, Call(op, parts)))
    joined = "*" if op == "*" else "+"
    return BinOp(joined, target, BinOp(joined, *parts))


@register
class TensorSplitToDecoupleOperators(Strategy):
    """Split the iteration range of loop `loop` of nest `nest` at `at`: the operands in `tensors` are copied,
    part by part, into two fresh tensors; each part computes its own partial result; a last step puts the
    parts together (two writes of disjoint halves when the loop indexes the result, one combining reduction
    `X = X op (P1 op P2)` when the loop is reduced).

    Preconditions: the nest is flat with one equation that reads its own target only as a reduction; the loop
    runs at least two iterations and 0 < at < its extent; it indexes the result through an affine subscript or
    is one of the reduced loops (then the target is not written before unless other reduced loops remain, so
    the combining step starts from the reduction's identity); every tensor in `tensors` is read at one
    subscript, affine in the loop and inside the tensor at every iteration. Partial results of a reduction
    keep the other reduced loops as subscripts, so the combining nest completes their reduction (the
    reference's stale combine loop is not reproduced)."""

    name = "tensor_split_to_decouple_operators"
    params = ("nest", "loop", "at", "tensors")
    nest_local = True

    def nest_context(self, program: Program, index: int) -> tuple:
        """The shapes of the tensors the nest accesses (copies must stay inside them) and which of the
        tensors it writes an earlier nest wrote (a reduction split must start from its identity)."""
        nest = program.nests[index]
        names = dict.fromkeys((*writes(nest), *reads(nest)))
        earlier = {name for before in program.nests[:index] for name in writes(before)}
        return (tuple((name, program.tensors[name].shape) for name in names if name in program.tensors),
                tuple(name for name in writes(nest) if name in earlier))

    def nest_candidates(self, program: Program, i: int, target: str) -> list[Action]:
        found = []
        for loop in program.nests[i].loops:
            plan = _legal(_split_plan)(program, i, loop.var)
            if plan is None:
                continue
            points = sorted({loop.extent // 2, loop.extent // 4} - {0})
            found += [self.action(nest=i, loop=loop.var, at=p, tensors=plan.copyable) for p in points]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index, at = int_param(action, "nest"), int_param(action, "at")
        plan = _split_plan(program, index, action["loop"])
        if not 0 < at < plan.extent:
            raise IllegalActionError(f"at must lie strictly inside loop {plan.var}'s range 0..{plan.extent}, got {at}")
        tensors = _names_param(action, "tensors")
        bad = [t for t in tensors if t not in plan.copyable]
        if bad:
            raise IllegalActionError(f"{', '.join(bad)} cannot be copied part by part (copyable: "
                                     f"{', '.join(plan.copyable) or 'none'})")
        new = _split_nests(program, plan, at, tensors)
        return program.replace_nests(program.nests[:index] + tuple(new) + program.nests[index + 1:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The split point and the copy order, read off the first new nest of `after`."""
        found = []
        for i, nest in enumerate(before.nests):
            if i >= len(after.nests) or after.nests[:i] != before.nests[:i] or nest == after.nests[i]:
                continue
            head = after.nests[i]
            for loop, new in zip(nest.loops, head.loops):
                if loop.var == new.var and new.extent < loop.extent and loop.kind == new.kind:
                    plan = _legal(_split_plan)(before, i, loop.var)
                    if plan is None:
                        continue
                    eqs = flat_equations(head) or []
                    order = tuple(eq.rhs.name for eq in eqs if isinstance(eq.rhs, Access))
                    tensors = order if all(t in plan.copyable for t in order) and len(order) == len(eqs) else ()
                    found.append(self.action(nest=i, loop=loop.var, at=new.extent, tensors=tensors))
            break
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, var, at = action["nest"], action["loop"], action["at"]
        plan = _split_plan(before, i, var)
        parts = f"{at} and {plan.extent - at} iterations of {var}"
        copies = (f"The operand(s) {', '.join(action['tensors'])} are copied part by part into separate tensors, "
                  "so each part reads only its own data. " if action["tensors"] else "")
        how = ("The loop indexes the result, so the two parts write disjoint parts of "
               f"{plan.equation.lhs.name}" if plan.spatial else
               f"The loop is reduced, so each part computes a partial {plan.reduction.op}-reduction and a final "
               "nest combines the two partial results")
        return (f"tensor_split_to_decouple_operators split nest {i} ({describe_loops(plan.nest.loops)}) along {var} "
                f"into two independent operators over {parts}. {copies}{how}; every element is computed exactly "
                "once, so the result is unchanged (up to the order of a reduction's additions). The two parts "
                "share no data and can run concurrently or be scheduled with different tile sizes; the copies "
                "and the combining step add memory traffic.")


def _split_nests(program: Program, plan: _SplitPlan, at: int, tensors: tuple[str, ...]) -> list[Nest]:
    eq, var, loops = plan.equation, plan.var, plan.nest.loops
    extents = (at, plan.extent - at)
    offsets = (0, at)
    taken: set[str] = set()

    def fresh() -> str:
        name = fresh_tensor(program, taken)
        taken.add(name)
        return name

    reads_at = {a.name: a for a in value_accesses(eq.rhs)}
    copies = {t: (fresh(), fresh()) for t in tensors}
    partials = (fresh(), fresh())
    partial = [Access(p, eq.lhs.dtype, "g", _partial_indices(plan)) for p in partials]

    nests: list[Nest] = []
    if tensors:
        for part in (0, 1):
            eqs = [Equation(replace(reads_at[t], name=copies[t][part], scope="g"),
                            _shift_access(reads_at[t], var, offsets[part])) for t in tensors]
            nests.append(_copy_nest(loops_with_extent(loops, var, extents[part]), eqs))

    for part in (0, 1):
        target = _shift_access(eq.lhs, var, offsets[part])

        def rewrite(acc: Access, part=part, target=target) -> Expr:
            if acc == target:
                return partial[part]
            if acc.name in copies:
                return replace(reads_at[acc.name], name=copies[acc.name][part], scope="g")
            return acc

        rhs = replace_accesses(shift_var(eq.rhs, var, offsets[part]), rewrite)
        nests.append(Nest(loops_with_extent(loops, var, extents[part]), (Equation(partial[part], rhs),)))
    if plan.spatial:
        for part in (0, 1):
            lhs = _shift_access(eq.lhs, var, offsets[part])
            nests.append(Nest(loops_with_extent(loops, var, extents[part]), (Equation(lhs, partial[part]),)))
    else:
        kept = tuple(l for l in loops if l.var != var)
        nests.append(Nest(kept, (Equation(eq.lhs, _combine(plan.reduction.op, eq.lhs, tuple(partial))),)))
    return nests


# -- tensor_concat_to_fuse_operators ------------------------------------------------------------------------------

def _pair_operands(one: Expr, two: Expr, targets: tuple[Access, Access], var: str,
                   pairs: list[tuple[Access, Access]]) -> bool:
    """Walk two right-hand sides in step; collect the pairs of accesses that depend on `var` (to be
    concatenated); True when the expressions are the same apart from those operands and their targets."""
    if type(one) is not type(two):
        return False
    if isinstance(one, Access):
        if one == targets[0] or two == targets[1]:
            return one == targets[0] and two == targets[1]
        if not mentions(one, var) and not mentions(two, var):
            return one == two
        if one.indices != two.indices or one.dtype != two.dtype:
            return False
        if (one, two) not in pairs:
            pairs.append((one, two))
        return True
    if isinstance(one, (Const, Var)):
        return one == two
    same_head = {BinOp: lambda a, b: a.op == b.op, Call: lambda a, b: a.func == b.func,
                 Compare: lambda a, b: a.ops == b.ops}.get(type(one), lambda a, b: True)
    kids1, kids2 = children(one), children(two)
    return same_head(one, two) and len(kids1) == len(kids2) and all(
        _pair_operands(a, b, targets, var, pairs) for a, b in zip(kids1, kids2))


@dataclass(frozen=True)
class _ConcatPlan:
    first: Nest
    second: Nest
    var: str
    pairs: tuple[tuple[Access, Access], ...]


def _concat_plan(program: Program, index, var) -> _ConcatPlan:
    first, eq1 = _single(program, index)
    if index + 1 >= len(program.nests):
        raise IllegalActionError(f"nest {index} is the last nest: there is nothing to concatenate it with")
    second, eq2 = _single(program, index + 1)
    if not any(l.var == var for l in first.loops):
        raise IllegalActionError(f"no loop {var!r} in nest {index} (loops: {', '.join(first.loop_vars)})")
    if len(first.loops) != len(second.loops) or any(
            (a.var, a.kind) != (b.var, b.kind) or (a.extent != b.extent and a.var != var)
            for a, b in zip(first.loops, second.loops)):
        raise IllegalActionError(f"nests {index} and {index + 1} differ in loops other than {var}")
    if eq1.lhs.name == eq2.lhs.name or eq1.lhs.indices != eq2.lhs.indices or eq1.lhs.dtype != eq2.lhs.dtype:
        raise IllegalActionError("the two results must be different tensors written at the same subscript")
    if Var(var) not in eq1.lhs.indices:
        raise IllegalActionError(f"{var} must be a plain subscript of the results (a loop the results are indexed by)")
    loop = first.loop(var)
    if loop.kind == "B" and var.startswith("t") and loop.extent + second.loop(var).extent > MAX_THREADS:
        raise IllegalActionError(f"{var} is bound to a thread axis: {loop.extent} + {second.loop(var).extent} "
                                 f"threads exceed the {MAX_THREADS} a block can hold")
    red1, red2 = reduction(first.loops, eq1), reduction(second.loops, eq2)
    for loops, eq, red in ((first.loops, eq1, red1), (second.loops, eq2, red2)):
        if scans(loops, eq) or (_reads_own_target(eq) and red is None):
            raise IllegalActionError(f"{eq.lhs.name} reads itself outside a reduction")
    if (red1 is None) != (red2 is None) or (red1 and (red1.op, red1.reduced_vars) != (red2.op, red2.reduced_vars)):
        raise IllegalActionError("the two nests do not perform the same kind of reduction")
    if set(writes(first)) & set(reads(second)) or set(reads(first)) & set(writes(second)):
        raise IllegalActionError(f"nests {index} and {index + 1} depend on each other")
    pairs: list[tuple[Access, Access]] = []
    if not _pair_operands(eq1.rhs, eq2.rhs, (eq1.lhs, eq2.lhs), var, pairs):
        raise IllegalActionError("the two equations do not apply the same operator (they differ beyond the "
                                 f"operands indexed by {var})")
    for one, two in pairs:
        for acc, nest in ((one, first), (two, second)):
            if not affine_in(acc, var) or not in_bounds(program, acc, bounds_of(nest.loops)):
                raise IllegalActionError(f"{acc.name} cannot be copied (subscript not affine in {var}, or it "
                                         "leaves the tensor)")
    names = [one.name for one, _ in pairs]
    if len(set(names)) != len(names):
        raise IllegalActionError("an operand of the first nest is paired with two different operands")
    for one, _ in pairs:
        if not _halves_apart(one, first.loops, second.loops, var):
            raise IllegalActionError(f"the second half of {one.name}'s concatenation, {var} shifted by "
                                     f"{first.loop(var).extent}, would overwrite elements of the first "
                                     f"({print_expr(one)} mixes {var} with another loop in one subscript)")
    return _ConcatPlan(first, second, var, tuple(pairs))


def _halves_apart(one: Access, first: tuple[Loop, ...], second: tuple[Loop, ...], var: str) -> bool:
    """True when the concatenated copy of operand `one` keeps its halves on different elements: `one`'s
    subscript over loops `first`, and the same subscript with `var` shifted by its extent there over loops
    `second` (`R_{c*2+d}` with d < 2 shifted by 2 reaches `R_{2..7}`, which c > 0 already uses). Proved by
    the index ranges of one subscript where they do not overlap, else by enumerating the elements; False
    where neither works."""
    bounds1, bounds2 = bounds_of(first), bounds_of(second)
    shifted = _shift_access(one, var, bounds1[var])
    if ranges_apart(one, bounds1, shifted, bounds2):
        return True
    ranges = [(index_range(a, bounds1), index_range(b, bounds2)) for a, b in zip(one.indices, shifted.indices)]
    if any(r is None or r[0] < 0 for pair in ranges for r in pair):
        return False
    shape = tuple(max(r1[1], r2[1]) + 1 for r1, r2 in ranges)
    halves = element_positions(one.indices, shape, bounds1), element_positions(shifted.indices, shape, bounds2)
    return halves[0] is not None and halves[1] is not None and not np.isin(halves[1], halves[0]).any()


@register
class TensorConcatToFuseOperators(Strategy):
    """Run two adjacent nests that apply the same operator to different tensors as one operator: the operands
    that depend on loop `loop` are concatenated along it (copy nests write the first nest's operand and the
    second's, offset by the first extent, into one tensor; `tensors` gives the copy order by the first nest's
    operand names), one nest computes the concatenated result, and two nests copy each half back.

    Preconditions: both nests are flat with one equation, have the same loops except for the extent of
    `loop`, write different tensors at the same subscript with `loop` as a plain subscript, perform the same
    reduction (or none, and read no target otherwise), do not depend on each other, and apply the same
    expression apart from the operands indexed by `loop` (read at equal, affine, in-bounds subscripts). Only
    the concatenated dimension may differ in size: the reference's block-diagonal concatenation of tensors
    differing in several dimensions reads unwritten elements and is not offered."""

    name = "tensor_concat_to_fuse_operators"
    params = ("nest", "loop", "tensors")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests) - 1):
            for loop in program.nests[i].loops:
                plan = _legal(_concat_plan)(program, i, loop.var)
                if plan is not None:
                    found.append(self.action(nest=i, loop=loop.var, tensors=tuple(a.name for a, _ in plan.pairs)))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        plan = _concat_plan(program, index, action["loop"])
        tensors = _names_param(action, "tensors")
        names = [a.name for a, _ in plan.pairs]
        if sorted(tensors) != sorted(names):
            raise IllegalActionError(f"tensors must order the operands to concatenate ({', '.join(names)}), "
                                     f"got {list(tensors)}")
        order = sorted(plan.pairs, key=lambda p: tensors.index(p[0].name))
        return program.replace_nests(program.nests[:index] + tuple(_concat_nests(program, plan, order))
                                     + program.nests[index + 2:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The copy order, read off the first copy nest of `after`."""
        found = []
        for i in range(len(before.nests) - 1):
            if after.nests[:i] != before.nests[:i] or i >= len(after.nests):
                continue
            eqs = flat_equations(after.nests[i]) or []
            order = tuple(eq.rhs.name for eq in eqs if isinstance(eq.rhs, Access))
            for loop in before.nests[i].loops:
                if _legal(_concat_plan)(before, i, loop.var) is not None:
                    found.append(self.action(nest=i, loop=loop.var, tensors=order))
            break
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i, var = action["nest"], action["loop"]
        plan = _concat_plan(before, i, var)
        one, two = plan.first.loop(var).extent, plan.second.loop(var).extent
        results = [flat_equations(n)[0].lhs.name for n in (plan.first, plan.second)]
        return (f"tensor_concat_to_fuse_operators ran nests {i} and {i + 1}, which apply the same operator to "
                f"different tensors, as one operator over {var} = {one} + {two} iterations: the operands indexed by "
                f"{var} ({', '.join(action['tensors'])} and the second nest's counterparts) are concatenated along {var}, one nest "
                f"computes both results, and two nests copy them back into {results[0]} and {results[1]}. It is "
                "legal because the nests are independent and every element of the concatenated result depends "
                "only on its own half. One larger launch replaces two smaller ones, which fills more parallel "
                "units; the concatenation and the copies add memory traffic.")


def _concat_nests(program: Program, plan: _ConcatPlan, pairs: list[tuple[Access, Access]]) -> list[Nest]:
    eq1, eq2 = flat_equations(plan.first)[0], flat_equations(plan.second)[0]
    var, offset = plan.var, plan.first.loop(plan.var).extent
    taken: set[str] = set()

    def fresh() -> str:
        name = fresh_tensor(program, taken)
        taken.add(name)
        return name

    joined = {one: fresh() for one, _ in pairs}
    result = Access(fresh(), eq1.lhs.dtype, "g", eq1.lhs.indices)
    copy1 = [Equation(replace(one, name=joined[one], scope="g"), one) for one, _ in pairs]
    copy2 = [Equation(_shift_access(replace(one, name=joined[one], scope="g"), var, offset), two) for one, two in pairs]

    def rewrite(expr: Expr) -> Expr:
        if isinstance(expr, Access):
            if expr == eq1.lhs:
                return result
            if expr in joined:
                return replace(expr, name=joined[expr], scope="g")
        return map_children(expr, rewrite)

    total = loops_with_extent(plan.first.loops, var, offset + plan.second.loop(var).extent)
    return [_copy_nest(plan.first.loops, copy1), _copy_nest(plan.second.loops, copy2),
            Nest(total, (Equation(result, rewrite(eq1.rhs)),)),
            Nest(plan.first.loops, (Equation(eq1.lhs, result),)),
            Nest(plan.second.loops, (Equation(eq2.lhs, _shift_access(result, var, offset)),))]


# -- common_subexpression_elimination --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Common:
    """A repeated sub-expression of a run of nests with the same loops, and where it occurs."""

    expr: Expr
    dtype: str
    start: int
    occurrences: tuple[tuple[int, int, Path], ...]  # (nest, equation, path)

    @property
    def end(self) -> int:
        return max(n for n, _, _ in self.occurrences)


def _occurrences(nest: Nest, eq: Equation, node: Expr) -> list[Path]:
    """Paths of the outermost occurrences of `node` among `eq`'s values that may read a stored copy."""
    found: list[Path] = []
    if not _storable(node, eq, nest):
        return found
    for path in value_paths(eq.rhs):
        if not any(path[:len(p)] == p for p in found) and node_at(eq.rhs, path) == node:
            found.append(path)
    return found


def _common_at(program: Program, start: int) -> _Common | None:
    """The first sub-expression (equation order, then pre-order) of nest `start` that occurs at least twice in
    the run of nests after it with the same loops, and can be computed once before the run."""
    nest = program.nests[start]
    eqs = flat_equations(nest)
    if not eqs:
        return None
    run = [start]
    for j in range(start + 1, len(program.nests)):
        if flat_equations(program.nests[j]) is None or program.nests[j].loops != nest.loops:
            break
        run.append(j)
    seen: set[Expr] = set()
    for eq in eqs:
        for path in value_paths(eq.rhs):
            node = node_at(eq.rhs, path)
            if not path or node in seen or not is_compound(node):
                continue
            seen.add(node)
            if _hoist_problem(program, nest, node, eq, False) is not None:
                continue
            found = _common_occurrences(program, run, node)
            unguarded = any(not under_branch(flat_equations(program.nests[n])[e].rhs, p) for n, e, p in found)
            if len(found) >= 2 and (unguarded or safe_everywhere(program, node, bounds_of(nest.loops))):
                return _Common(node, eq.lhs.dtype, start, tuple(found))
    return None


def _common_occurrences(program: Program, run: list[int], node: Expr) -> list[tuple[int, int, Path]]:
    inputs = {a.name for a in value_accesses(node)}
    found = []
    for n in run:
        nest = program.nests[n]
        if inputs & set(writes(nest)):
            break
        for e, eq in enumerate(flat_equations(nest)):
            found += [(n, e, p) for p in _occurrences(nest, eq, node)]
    return found


def _eliminate(program: Program, common: _Common, nests: list[Nest], taken: set[str]) -> None:
    """Compute `common.expr` once in a nest before its run and read it at every occurrence (in place)."""
    source = program.nests[common.start]
    order = _vars_in_loop_order(source, common.expr)
    name = fresh_tensor(program, taken)
    taken.add(name)
    target = Access(name, common.dtype, "g", tuple(Var(v) for v in order))
    by_nest: dict[int, list[tuple[int, Path]]] = {}
    for n, e, p in common.occurrences:
        by_nest.setdefault(n, []).append((e, p))
    for n, sites in by_nest.items():
        eqs = flat_equations(nests[n])
        for e, p in sites:
            eqs[e] = Equation(eqs[e].lhs, replace_at(eqs[e].rhs, p, target))
        nests[n] = replace(nests[n], body=tuple(eqs))
    nests.insert(common.start, compute_nest(source, common.expr, target, order, order))


@register
class CommonSubexpressionElimination(Strategy):
    """For each nest index in `nests`, compute the first sub-expression of that nest that repeats (within an
    equation, across its equations, or in the following nests with the same loops) once, in a new nest placed
    before it, and read the stored value at every occurrence.

    Preconditions: each listed nest is flat; the sub-expression is an operation (not a leaf) outside any
    subscript, of the equation's float dtype without conversion, occurs at least twice (structurally equal,
    parentheses ignored) in nests that do not write what it reads, and is safe to evaluate at every iteration;
    listed nests are increasing and each one's occurrences end before the next listed nest."""

    name = "common_subexpression_elimination"
    params = ("nests",)

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        sites = [i for i in range(len(program.nests)) if _common_at(program, i) is not None]
        found = [self.action(nests=(i,)) for i in sites]
        together, end = [], -1
        for i in sites:
            if i > end:
                together.append(i)
                end = _common_at(program, i).end
        if len(together) > 1:
            found.append(self.action(nests=tuple(together)))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        starts = action["nests"]
        if not isinstance(starts, tuple) or not starts or not all(isinstance(s, int) for s in starts):
            raise IllegalActionError(f"nests must be a non-empty list of nest indices, got {starts!r}")
        commons = []
        for start in starts:
            nest_at(program, start)
            common = _common_at(program, start)
            if common is None:
                raise IllegalActionError(f"nest {start} has no repeated sub-expression that can be computed once")
            if commons and start <= commons[-1].end:
                raise IllegalActionError(f"nest {start} lies inside the run of nest {commons[-1].start}; list "
                                         "increasing nests whose runs do not overlap")
            commons.append(common)
        nests, taken = list(program.nests), set()
        for common in reversed(commons):
            _eliminate(program, common, nests, taken)
        return program.replace_nests(nests)

    def explain(self, before: Program, action: Action, after: Program) -> str:
        parts = []
        for start in action["nests"]:
            common = _common_at(before, start)
            nests = sorted({n for n, _, _ in common.occurrences})
            parts.append(f"{print_expr(common.expr)} ({len(common.occurrences)} occurrences in nest"
                         f"{'s' if len(nests) > 1 else ''} {', '.join(map(str, nests))})")
        return (f"common_subexpression_elimination computed {'; '.join(parts)} once per iteration in a new nest "
                "and replaced each occurrence by a read of the stored value. It is legal because the occurrences "
                "are structurally identical and nothing they read is written between the new nest and them, so "
                "they all hold the same value. Each repeated evaluation (often a transcendental call) becomes a "
                "load; the stored tensor costs one write and its reads.")


# -- dead_code_elimination -----------------------------------------------------------------------------------------

@register
class DeadCodeElimination(Strategy):
    """Delete nest `nest`, whose results nobody uses.

    Preconditions: every tensor the nest writes is an intermediate (not an output) that no later nest reads,
    so removing the nest cannot change an output."""

    name = "dead_code_elimination"
    params = ("nest",)

    def site(self, program: Program, index) -> None:
        nest = nest_at(program, index)
        for name in writes(nest):
            if not is_intermediate(program, name):
                raise IllegalActionError(f"nest {index} writes {name}, a signature tensor")
        readers = users(program.nests, index)
        if readers:
            raise IllegalActionError(f"nest {index}'s results are read by nest{'s' if len(readers) > 1 else ''} "
                                     f"{', '.join(map(str, readers))}")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        return [self.action(nest=i) for i in range(len(program.nests)) if _holds(self.site, program, i)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        self.site(program, index)
        return program.replace_nests(program.nests[:index] + program.nests[index + 1:])

    def explain(self, before: Program, action: Action, after: Program) -> str:
        i = action["nest"]
        nest = before.nests[i]
        return (f"dead_code_elimination deleted nest {i}, which writes {', '.join(writes(nest))}. No later nest "
                "reads these intermediates and none is an output, so the nest cannot affect the result. It "
                f"saves {trip_count(nest.loops)} iterations and the memory of the dead tensors.")
