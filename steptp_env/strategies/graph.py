"""Graph-level strategies: they move work between nests (fusion, fission, inlining, splitting an expression,
statement order) without changing what any output holds. Splitting or concatenating a tensor is in
`tensor_split_concat.py`, common subexpressions and dead code in `eliminations.py`.

Legality comes from the use-def chains and the per-iteration access analysis of `graph_util`, never from the
text. Where the reference writes a transformation in a fixed shape (copy nests that keep the loops of the
nest they feed, a hoisted nest bound to threadIdx.x on GPU programs), the result has that shape so that
`identify` recognises the reference's rows; its known bugs are not reproduced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import reads, users, writes
from ..ir.ast import (Access, Call, Const, Equation, Expr, Loop, Nest, Var, accesses, equations, free_vars,
                      replace_accesses)
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (Path, bounds_of, compute_nest, describe_loops, flat_equations, flat_nest, float_valued,
                         hoist_problem, injective_subscript, map_equation, map_nest_with_loops, names_param,
                         nest_accesses, node_at, one_equation, ranges_apart, reads_own_target, replace_at,
                         same_iteration_conflict, substitute, trip_count, under_branch, value_accesses, value_paths,
                         vars_in_loop_order, with_scope)
from .outer_fusion import fuse_under, loop_key, shared_depth
from .util import fresh_tensor, holds, int_param, is_intermediate, nest_at, quiet

SCOPE_NAMES = {"g": "global memory", "s": "shared memory", "l": "local memory (registers)"}


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
        first, eqs1 = flat_nest(program, index)
        second, eqs2 = flat_nest(program, index + 1)
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
            site = quiet(self.site, program, i)
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
            if quiet(self.site, program, index, depth) is not None:
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
        nest, eqs = flat_nest(program, index)
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
            found += [self.action(nest=i, at=k) for k in range(1, len(eqs)) if quiet(self.site, program, i, k)]
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
    nest, eq = one_equation(program, index)
    name = eq.lhs.name
    if not is_intermediate(program, name):
        raise IllegalActionError(f"{name} is a signature tensor: only intermediates are inlined")
    if any(name in writes(n) for j, n in enumerate(program.nests) if j != index):
        raise IllegalActionError(f"{name} is also written by other nests")
    if reads_own_target(eq):
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
            producer = quiet(_producer, program, i)
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
    reason = hoist_problem(program, nest, node, eq, under_branch(eq.rhs, path))
    if reason:
        raise IllegalActionError(f"cannot split out {print_expr(node)}: {reason}")
    return e, path, node


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
                    if hoist_problem(program, nest, node, eq, under_branch(eq.rhs, path)) is None:
                        order = vars_in_loop_order(nest, node)
                        found.append(self.action(nest=i, term=(e,) + path, dims=order, loops=order))
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        index = int_param(action, "nest")
        nest, eqs = flat_nest(program, index)
        e, path, node = _split_term(program, nest, eqs, action["term"])
        dims, order = names_param(action, "dims"), names_param(action, "loops")
        used = set(vars_in_loop_order(nest, node))
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
        return [self.action(nest=i) for i in range(len(program.nests) - 1) if holds(self.site, program, i)]

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
