"""The value splits: additive_split (x = x + p - p), multiplicative_split (x = x / p * p) and
exponential_split (exp(a - b) = exp(a - p) * exp(p - b), or exp(a - p) / exp(b - p)) rewrite one value of an
equation in terms of p, another tensor's value or its predecessor along the last subscript: the first step of
the online algorithms' rescaling. They reassociate floating-point work (each class names its rounding), and p
must be finite wherever it is read, non-zero for a division (ValueFacts): the reference's `x/p*p` with a data
value p that may be zero is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import element_positions, reduction, written_elements
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Var, accesses, children,
                      equations, free_vars, walk)
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (bounds_of, describe_loops, flat_equations, in_bounds, node_at, ranges_apart, replace_at,
                         trip_count, value_dtype, value_paths)
from .online_util import FINITE, NONZERO_FINITE, ValueFacts, lagged
from .util import flag_param, int_param, nest_at, quiet, writer_nests


def _catalogue(program: Program, name: str) -> list[Access]:
    """The distinct accesses of tensor `name` (by subscript) in program order, writes before reads within an
    equation: what a split's `at` parameter indexes."""
    found: dict[tuple, Access] = {}
    for nest in program.nests:
        for _, eq in equations(nest):
            for acc in (eq.lhs, *accesses(eq.rhs)):
                if acc.name == name:
                    found.setdefault(acc.indices, replace(acc, parens=0))
    return list(found.values())


@dataclass(frozen=True)
class _SplitSite:
    """The sub-expression `node` at `path` (equation index, then child positions) of flat nest `index`."""

    index: int
    path: tuple[int, ...]
    eq: Equation
    node: Expr
    loops: tuple[Loop, ...]

    @property
    def parent(self) -> Expr | None:
        """The node around the split value (None when it is the whole right-hand side)."""
        return node_at(self.eq.rhs, self.path[1:-1]) if len(self.path) > 1 else None


def _value_position(expr: Expr, path: tuple[int, ...]) -> str | None:
    """Why the node at `path` is not a value the equation computes with (a subscript, a condition), or None."""
    node = expr
    for step in path:
        if isinstance(node, (Access, Compare, And)):
            return "inside a subscript or a comparison"
        if isinstance(node, Call) and node.func == "if_then_else" and step == 0:
            return "inside the condition of an if_then_else"
        node = children(node)[step]
    return None


class _Split(Strategy):
    """Shared machinery: rewrite the value at `path` of nest `nest` in terms of p, an access of tensor `by` at
    its `at`-th distinct subscript in the program, or (`shift=1`) its predecessor along the last subscript,
    guarded to the split's identity at the first element."""

    params = ("nest", "path", "by", "at", "shift")
    identity = 0
    allowed = FINITE
    requirement = "finite"

    def source(self, node: Expr) -> Access | None:
        """The access whose predecessor the candidate menu splits by (default: the value itself, when it is a
        float read), or None where nothing is offered."""
        return node if isinstance(node, Access) and is_float(node.dtype) else None

    def rewrite(self, site: _SplitSite, p: Expr, action: Action) -> Expr:
        raise NotImplementedError

    def site(self, program: Program, index, path) -> _SplitSite:
        nest = nest_at(program, index)
        eqs = flat_equations(nest)
        if eqs is None:
            raise IllegalActionError(f"nest {index} holds an inner nest; splits work on flat nests")
        if not isinstance(path, tuple) or not path or not all(isinstance(s, int) for s in path) \
                or not 0 <= path[0] < len(eqs):
            raise IllegalActionError(f"path must be [equation, child, ...] with equation below {len(eqs)}, "
                                     f"got {path!r}")
        eq = eqs[path[0]]
        node = node_at(eq.rhs, path[1:])
        why = _value_position(eq.rhs, path[1:])
        if why is None and eq.lhs.name in {a.name for a in accesses(node)}:
            why = f"it reads the target {eq.lhs.name} (the accumulator stays outside the split)"
        if why is None and not is_float(value_dtype(node, eq.lhs.dtype) or ""):
            why = "it is not a float value"
        if why is None:
            why = self.unsuitable(node)
        if why:
            raise IllegalActionError(f"cannot split {print_expr(node)} in nest {index}: {why}")
        return _SplitSite(index, path, eq, node, nest.loops)

    def unsuitable(self, node: Expr) -> str | None:
        return None

    def split_value(self, program: Program, site: _SplitSite, by, at, shift, facts: ValueFacts) -> Expr:
        """p, checked: in bounds, available before the nest, and of the kinds the split allows."""
        found = _catalogue(program, by) if isinstance(by, str) else []
        if not isinstance(at, int) or not 0 <= at < len(found):
            raise IllegalActionError(f"{by!r} has no access number {at!r} ({len(found)} distinct subscripts)")
        base = found[at]
        bounds = bounds_of(site.loops)
        if not is_float(base.dtype) or not in_bounds(program, base, bounds):
            raise IllegalActionError(f"{print_expr(base)} is not a float read inside {by} for every iteration "
                                     f"of nest {site.index}")
        if not _available(program, base, site.index, bounds, int(bool(shift))):
            what = f"the predecessor of {print_expr(base)}" if shift else print_expr(base)
            raise IllegalActionError(f"{what} is not written (or not final) before nest {site.index}")
        if shift and not (base.rank and free_vars(base.indices[-1])):
            raise IllegalActionError(f"{print_expr(base)} has no loop variable in its last subscript to shift")
        p = lagged(base, base.rank - 1, Const(self.identity)) if shift else base
        kinds = facts.kinds(p)
        if not kinds <= self.allowed:
            raise IllegalActionError(f"{print_expr(p)} may be {', '.join(sorted(kinds - self.allowed))}; "
                                     f"{self.name} needs a {self.requirement} split value")
        return p

    def plan(self, program: Program, action: Action, facts: ValueFacts) -> tuple[_SplitSite, Expr, Expr]:
        site = self.site(program, int_param(action, "nest"), action["path"])
        p = self.split_value(program, site, action["by"], action["at"], flag_param(action, "shift"), facts)
        return site, p, self.rewrite(site, p, action)

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        site, _, rhs = self.plan(program, action, ValueFacts(program))
        nest = program.nests[site.index]
        body = tuple(Equation(s.lhs, rhs) if k == site.path[0] else s for k, s in enumerate(nest.body))
        nests = program.nests
        return program.replace_nests(nests[:site.index] + (replace(nest, body=body),) + nests[site.index + 1:])

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        """Sites inside reduction operands only (where a split prepares a prefix or online form), split by the
        predecessor of the site's own operand."""
        facts = ValueFacts(program)
        found = []
        for i, nest in enumerate(program.nests):
            for e, eq in enumerate(flat_equations(nest) or []):
                if reduction(nest.loops, eq) is None:
                    continue
                for sub in value_paths(eq.rhs):
                    source = self.source(node_at(eq.rhs, sub))
                    if source is None:
                        continue
                    at = [a.indices for a in _catalogue(program, source.name)].index(source.indices)
                    action = self.action(nest=i, path=(e,) + sub, by=source.name, at=at, shift=1, **self.forms()[0])
                    if quiet(self.plan, program, action, facts) is not None:
                        found.append(action)
        return found

    def forms(self) -> tuple[dict, ...]:
        """Values of the strategy's extra parameters; the first is the candidate menu's."""
        return ({},)

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Split values read off the one changed sub-expression of `after`, at that node or its children."""
        changed = [i for i, (a, b) in enumerate(zip(before.nests, after.nests)) if a != b]
        if len(before.nests) != len(after.nests) or len(changed) != 1:
            return []
        i = changed[0]
        old, new = flat_equations(before.nests[i]), flat_equations(after.nests[i])
        if old is None or new is None or len(old) != len(new):
            return []
        found = []
        for e, (x, y) in enumerate(zip(old, new)):
            if x == y or x.lhs != y.lhs:
                continue
            path = _diff_path(x.rhs, y.rhs)
            subs = [path] + [path + (k,) for k in range(len(children(node_at(x.rhs, path))))]
            for sub in subs:
                for by, at, shift in _split_values(before, node_at(y.rhs, path)):
                    for form in self.forms():
                        found.append(self.action(nest=i, path=(e,) + sub, by=by, at=at, shift=shift, **form))
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        facts = ValueFacts(before)
        site, p, rhs = self.plan(before, action, facts)
        by = action["by"]
        origin = (f"{by} is caller data, finite by assumption" if by in before.signature
                  and before.signature[by].role != "output" else
                  f"{by} is written by nest{'s' if len(writer_nests(before, by)) > 1 else ''} "
                  f"{', '.join(map(str, writer_nests(before, by)))}, whose values the analysis bounds to "
                  f"{{{', '.join(sorted(facts.tensor_kinds(by)))}}}")
        where = ("the predecessor of " + print_expr(_catalogue(before, by)[action["at"]]) + " along its last "
                 f"subscript ({self.identity} at the first element)" if action["shift"] else print_expr(p))
        nest = before.nests[site.index]
        return (f"{self.name} rewrote {print_expr(site.node)} in equation {site.path[0]} of nest {site.index} "
                f"({describe_loops(nest.loops)}), which now computes {site.eq.lhs.name} = {print_expr(rhs)}, "
                f"with p = {where}. It is legal because {origin}, so p is {self.requirement} wherever it is read "
                f"and the rewrite is an identity in exact arithmetic ({self.identity_text}). Not bitwise: "
                f"rounding changes, {self.rounding}; verification decides. The nest still makes one pass of "
                f"{trip_count(nest.loops)} iterations, with one more read and two more operations per iteration: "
                "on its own it is slower; it exposes p so that a later rewrite (a prefix or online form, "
                "or moving the p terms out of the reduction) can use it.")


def _available(program: Program, read: Access, index: int, bounds: dict[str, int], shift: int = 0) -> bool:
    """True when every element `read` names (inside loops `bounds`; with `shift`, its predecessor along the
    last subscript instead, where it has one) is written before nest `index` and holds its final value there.

    Final: the tensor is caller data, or only earlier nests write it, or an earlier nest writes `read`'s very
    elements (same subscript, loops at least as long) and the later writes up to nest `index` are provably
    elsewhere (a different constant subscript, as `D_{1,...}` after `D_{0,...}`). Written: that same-subscript
    write covers `read`, and its predecessors too when the last subscript is a loop variable of its own;
    otherwise the earlier writes are enumerated (`_written_before`). A copy that tensor_split made may hold
    only every third element: the elements between are memory that nobody wrote."""
    name = read.name
    if name in program.signature and program.signature[name].role != "output":
        return True
    writers = writer_nests(program, name)
    used = {v for i in read.indices for v in free_vars(i)}
    same = next((j for j in reversed([w for w in writers if w < index]) for loops, eq in equations(program.nests[j])
                 if eq.lhs.indices == read.indices and all(bounds_of(loops).get(v, 0) >= bounds[v] for v in used)),
                None)
    if not (writers and max(writers) < index) and not (
            same is not None and all(ranges_apart(other.lhs, bounds_of(around), read, bounds)
                                     for w in writers if same < w <= index
                                     for around, other in equations(program.nests[w]) if other.lhs.name == name)):
        return False
    last = read.indices[-1] if read.rank else None
    own_var = isinstance(last, Var) and all(last.name not in free_vars(i) for i in read.indices[:-1])
    return (same is not None and (not shift or own_var)) or _written_before(program, read, index, bounds, shift)


def _written_before(program: Program, read: Access, index: int, bounds: dict[str, int], shift: int) -> bool:
    """True when nests before `index` write every element `read` names inside loops `bounds` (with `shift`,
    the predecessor along the last subscript, where one exists); False where that cannot be shown."""
    done = written_elements(program, read.name, index)
    if done is True or done is None:
        return bool(done)
    wanted = element_positions(read.indices, done.shape, bounds, -shift)
    return wanted is not None and bool(done.ravel()[wanted].all())


def _diff_path(one: Expr, two: Expr) -> tuple[int, ...]:
    """Path to the smallest sub-expression of `one` that differs from the same place in `two`."""
    path: list[int] = []
    while type(one) is type(two) and _head(one) == _head(two) and len(children(one)) == len(children(two)):
        differing = [k for k, (a, b) in enumerate(zip(children(one), children(two))) if a != b]
        if len(differing) != 1:
            break
        path.append(differing[0])
        one, two = children(one)[differing[0]], children(two)[differing[0]]
    return tuple(path)


def _head(expr: Expr):
    return getattr(expr, "op", None) or getattr(expr, "func", None) or getattr(expr, "name", None)


def _split_values(program: Program, expr: Expr) -> list[tuple[str, int, int]]:
    """(by, at, shift) of every access in `expr`, and of every guarded predecessor
    `if_then_else(e-1<0,k,X_{...,e-1})`, whose subscript the program already uses."""
    found: dict[tuple, None] = {}
    for node in walk(expr):
        if isinstance(node, Access):
            key, shift = node, 0
        elif isinstance(node, Call) and node.func == "if_then_else" and isinstance(node.args[2], Access) \
                and node.args[2].rank:
            shifted = node.args[2]
            cond = node.args[0]
            if not (isinstance(cond, Compare) and isinstance(cond.operands[0], BinOp)):
                continue
            key = replace(shifted, indices=shifted.indices[:-1] + (cond.operands[0].lhs,))
            if lagged(key, key.rank - 1, node.args[1]) != node:
                continue
            shift = 1
        else:
            continue
        subscripts = [a.indices for a in _catalogue(program, key.name)]
        if key.indices in subscripts:
            found.setdefault((key.name, subscripts.index(key.indices), shift), None)
    return list(found)


@register
class AdditiveSplit(_Split):
    """Write the value x at `path` of nest `nest` as x + p - p (see `_Split` for p). Inside a sum the terms
    join the chain (`y+x` becomes `y+x+p-p`), elsewhere x+p-p takes x's place.

    Preconditions: the nest is flat; x is a float value (not inside a subscript or condition, not reading
    the equation's target); p is a float read, in bounds for every iteration, of a tensor complete before the
    nest (an input, or written only by earlier nests), and finite wherever it is read (ValueFacts)."""

    name = "additive_split"
    identity_text = "x + p - p = x"
    rounding = "x+p rounds to the precision of |p|, so up to one ulp of |p| is lost"

    def rewrite(self, site: _SplitSite, p: Expr, action: Action) -> Expr:
        rhs, sub, parent = site.eq.rhs, site.path[1:], site.parent
        if isinstance(parent, BinOp) and (parent.op == "+" or (parent.op == "-" and sub[-1] == 0)):
            if sub[-1] == 0:
                return replace_at(rhs, sub[:-1], replace(parent, lhs=BinOp("-", BinOp("+", site.node, p), p)))
            chain = BinOp("-", BinOp("+", replace(parent, parens=0), p), p, parens=parent.parens)
            return replace_at(rhs, sub[:-1], chain)
        return replace_at(rhs, sub, BinOp("-", BinOp("+", site.node, p), p))


@register
class MultiplicativeSplit(_Split):
    """Write the value x at `path` of nest `nest` as x / p * p (see `_Split` for p), parenthesized inside a
    product or quotient.

    Preconditions: those of additive_split, and p is provably non-zero and finite wherever it is read: a
    positive constant, an exp, a softplus, a sigmoid, ... (ValueFacts); a data value that may be zero is
    refused (the reference divides by such values)."""

    name = "multiplicative_split"
    identity = 1
    allowed = NONZERO_FINITE
    requirement = "non-zero and finite"
    identity_text = "x / p * p = x for p != 0"
    rounding = "x/p*p rounds twice, up to about one ulp of x"

    def rewrite(self, site: _SplitSite, p: Expr, action: Action) -> Expr:
        inside_product = isinstance(site.parent, BinOp) and site.parent.op in ("*", "/")
        split = BinOp("*", BinOp("/", site.node, p), p, parens=int(inside_product))
        return replace_at(site.eq.rhs, site.path[1:], split)


@register
class ExponentialSplit(_Split):
    """Write exp(a - b) at `path` of nest `nest` as exp(a - p) * exp(p - b) (`form=mul`) or
    exp(a - p) / exp(b - p) (`form=div`), and any other exp(x) as exp(x - p) * exp(p) (see `_Split` for p).

    Preconditions: those of additive_split, with x an exp call; `form=div` needs an argument of the form
    a - b. p finite keeps both factors free of inf*0; they can still overflow when x and p differ by more
    than about 88 (float32), which no analysis of the data rules out: verification decides."""

    name = "exponential_split"
    params = _Split.params + ("form",)
    identity_text = "exp(a-p)*exp(p-b) = exp(a-b)"
    rounding = "the product of two rounded exponentials differs from one exponential by a few ulps"

    def unsuitable(self, node: Expr) -> str | None:
        return None if isinstance(node, Call) and node.func == "exp" else "it is not an exp call"

    def source(self, node: Expr) -> Access | None:
        if not (isinstance(node, Call) and node.func == "exp"):
            return None
        arg = node.args[0]
        for path in value_paths(arg):
            found = node_at(arg, path)
            if isinstance(found, Access) and is_float(found.dtype) and _value_position(arg, path) is None:
                return found
        return None

    def forms(self) -> tuple[dict, ...]:
        return ({"form": "mul"}, {"form": "div"})

    def rewrite(self, site: _SplitSite, p: Expr, action: Action) -> Expr:
        form = action["form"]
        if form not in ("mul", "div"):
            raise IllegalActionError(f"form must be mul or div, got {form!r}")
        arg = site.node.args[0]
        difference = isinstance(arg, BinOp) and arg.op == "-"
        if form == "div" and not difference:
            raise IllegalActionError(f"form=div needs exp(a - b), not exp({print_expr(arg)})")
        if form == "div":
            new = BinOp("/", _exp(BinOp("-", arg.lhs, p)), _exp(BinOp("-", arg.rhs, p)))
        elif difference:
            new = BinOp("*", _exp(BinOp("-", arg.lhs, p)), _exp(BinOp("-", p, arg.rhs)))
        else:
            new = BinOp("*", _exp(BinOp("-", arg, p)), _exp(p))
        return replace_at(site.eq.rhs, site.path[1:], new)


def _exp(arg: Expr) -> Call:
    return Call("exp", (arg,))
