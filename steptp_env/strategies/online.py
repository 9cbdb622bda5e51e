"""Online-algorithm strategies: prefix (scan) forms of reductions, online softmax, flash attention without
tiling, the exponential / additive / multiplicative splits, and partially-equivalent-then-correct.

Sites come from the analysis, never from the text: a max reduction is `reduction(...).op == "max"` over one
loop, a softmax chain is a sum-of-exp reduction whose exponent subtracts a tensor that use-def traces to a max
reduction of the same values, attention is that chain followed by the normalisation and the one reduction that
reads the probabilities. Numerics are not bitwise: every rewrite here reassociates or rescales floating-point
work, the explanations say so, and candidates are offered only where `ValueFacts` proves the rewrite cannot
create NaN or a division by zero (the reference's `x/p*p` with a data value `p`, and its online recurrences
on rows whose first score is -inf, are not offered).

Result shapes follow the Step-TP reference (scan tensors that keep one element per step, guarded
predecessors `if_then_else(a-1<0,-inf,X_{...,a-1})`, a copy nest that reads the last step) so that `identify`
recognises its rows. online_softmax and flashattention_wo_tiling also offer `state=inplace`, one running value
per row updated in place: the same recurrences without the per-step storage, which is what makes them pay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import element_positions, reads, reduction, reduction_identity, writes, written_elements
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Nest, Statement, Var, accesses,
                      children, equations, free_vars, map_children, replace_accesses, walk)
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import (bounds_of, describe_loops, flat_equations, in_bounds, loops_with_extent, node_at, ranges_apart,
                         replace_at, substitute, trip_count, value_dtype, value_paths)
from .online_util import (FINITE, MINUS_INF, NONZERO_FINITE, POS_INF, ValueFacts, extended, finite_guard, lagged,
                          positional_renaming, rename_vars, scan_dim, single_equation)
from .util import fresh_loop_var, fresh_tensor, nest_at


# -- shared checks -------------------------------------------------------------------------------------------------

def _int(action: Action, key: str) -> int:
    value = action[key]
    if not isinstance(value, int):
        raise IllegalActionError(f"{key} must be an integer, got {value!r}")
    return value


def _flag(action: Action, key: str) -> int:
    value = action[key]
    if value not in (0, 1):
        raise IllegalActionError(f"{key} must be 0 or 1, got {value!r}")
    return value


def _quiet(check, *args):
    """`check(*args)`, or None where it raises IllegalActionError (for candidate enumeration)."""
    try:
        return check(*args)
    except IllegalActionError:
        return None


def _pinned(expr: Expr, loops: tuple[Loop, ...]) -> Expr:
    """`expr` with the variables of one-iteration loops replaced by 0, so `H_{a,c}` inside `L^{1}_{c=0}`
    compares equal to `H_{a,0}`."""
    return substitute(expr, {l.var: Const(0) for l in loops if l.extent == 1})


def _is_intermediate(program: Program, name: str) -> bool:
    return name not in program.signature


def _writer_nests(program: Program, name: str) -> list[int]:
    return [j for j, n in enumerate(program.nests) if name in writes(n)]


def _reader_nests(program: Program, name: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Nests that read `name`, apart from its writers (a reduction reads its own target) and `exclude`."""
    return [j for j, n in enumerate(program.nests)
            if name in reads(n) and name not in writes(n) and j not in exclude]


def _map_accesses(nest: Nest, fn) -> Nest:
    """`nest` with every access (reads and writes, inner nests included) passed through `fn`."""
    def stmt(s):
        if isinstance(s, Nest):
            return _map_accesses(s, fn)
        return Equation(replace_accesses(s.lhs, fn), replace_accesses(s.rhs, fn))
    return replace(nest, body=tuple(stmt(s) for s in nest.body))


@dataclass(frozen=True)
class _Scan:
    """A tensor that keeps one element per step of a scanned loop: `access` is its write (the step subscript,
    at position `dim`, is the loop variable), `extent` the number of steps."""

    access: Access
    dim: int
    extent: int

    def prev(self, identity: Expr) -> Expr:
        return lagged(self.access, self.dim, identity)

    def last(self, read: Access) -> Access:
        """`read` (a read of the reduced tensor, without step subscript) redirected to the last step."""
        return replace(extended(read, Const(self.extent - 1), self.dim), name=self.access.name)


def _last_step(scans: dict[str, _Scan]):
    """Access rewriter: a read of tensor X becomes a read of the last step of `scans[X]`
    (`D_{tx}` -> `D_{tx,16383}`)."""
    def fn(acc: Access) -> Access:
        scan = scans.get(acc.name)
        return acc if scan is None else scan.last(acc)
    return fn


# -- running maximum and running sum (normal_loop_max_to_prefix_max, ..._summation_..., online_softmax) ---------------

@dataclass(frozen=True)
class _MaxSite:
    """A max reduction `M = max(M, x)` over the single loop `var`."""

    index: int
    nest: Nest
    eq: Equation
    var: str

    @property
    def x(self) -> Expr:
        return reduction(self.nest.loops, self.eq).operand

    @property
    def extent(self) -> int:
        return self.nest.loop(self.var).extent

    @property
    def outer(self) -> tuple[Loop, ...]:
        return tuple(l for l in self.nest.loops if l.var != self.var)


def _max_site(program: Program, index) -> _MaxSite:
    nest = nest_at(program, index)
    eq = single_equation(nest)
    if eq is None:
        raise IllegalActionError(f"nest {index} is not a flat nest with one equation")
    red = reduction(nest.loops, eq)
    if red is None or red.op != "max":
        raise IllegalActionError(f"nest {index} is not a max reduction")
    if len(red.reduced_vars) != 1:
        raise IllegalActionError(f"nest {index} reduces over {len(red.reduced_vars)} loops "
                                 f"({', '.join(red.reduced_vars)}); a prefix form needs exactly one")
    var = red.reduced_vars[0]
    if nest.loop(var).kind != "L":
        raise IllegalActionError(f"loop {var} is {nest.loop(var).kind}, not serial: a scan must run it in order")
    if not is_float(eq.lhs.dtype):
        raise IllegalActionError(f"{eq.lhs.name} is {eq.lhs.dtype}; the prefix forms start from -inf")
    return _MaxSite(index, nest, eq, var)


def _scan_of(site: _MaxSite, target: Access, name: str, scope: str) -> _Scan:
    """The scan that replaces the reduction into `target` (in the max nest's variables), named `name`."""
    dim = scan_dim(target.indices, site.nest.loops, site.var)
    access = replace(extended(target, Var(site.var), dim, scope), name=name)
    return _Scan(access, dim, site.extent)


def _running_max(m: _Scan, x: Expr) -> Equation:
    """`F_{...,r,...}=max(if_then_else(r-1<0,-inf,F_{...,r-1,...}),x)`: the running maximum, one per step."""
    return Equation(m.access, Call("max", (m.prev(MINUS_INF), x)))


def _rescaled_sum(m: _Scan, s: _Scan, x: Expr, guard: int) -> Equation:
    """`S_r = S_{r-1}*exp(M_{r-1}-M_r)+exp(x-M_r)`: the running sum of exp(x-M_r), rescaled whenever the
    running maximum grows."""
    scale = Call("exp", (BinOp("-", m.prev(MINUS_INF), m.access),))
    value = BinOp("+", BinOp("*", s.prev(Const(1)), scale), Call("exp", (BinOp("-", x, m.access),)))
    return Equation(s.access, finite_guard(m.access, value) if guard else value)


def _copy_last(loops: tuple[Loop, ...], target: Access, scan: _Scan) -> Nest:
    """`target = scan_{...,last,...}` over `loops`: the final value of a scan, under the old name."""
    return Nest(loops, (Equation(target, scan.last(target)),))


@dataclass(frozen=True)
class _Chain:
    """A softmax-style chain: max reduction M of x (nest `site.index`) and the sum S of exp(x - M) (nest
    `index`), both over the same loops (the sum's variables renamed to the max nest's)."""

    site: _MaxSite
    index: int
    s: Access  # the sum's target, in the max nest's variables

    @property
    def chain(self) -> _Chain:
        return self


def _chain(program: Program, index) -> _Chain:
    nest = nest_at(program, index)
    eq = single_equation(nest)
    red = reduction(nest.loops, eq) if eq is not None else None
    if red is None or red.op != "+" or len(red.reduced_vars) != 1:
        raise IllegalActionError(f"nest {index} is not a sum over one loop")
    arg = red.operand.args[0] if isinstance(red.operand, Call) and red.operand.func == "exp" else None
    if not (isinstance(arg, BinOp) and arg.op == "-" and isinstance(arg.rhs, Access)):
        raise IllegalActionError(f"the sum in nest {index} does not add exp(x - M) with M a tensor")
    m_name = arg.rhs.name
    writers = _writer_nests(program, m_name)
    if len(writers) != 1 or writers[0] >= index or not _is_intermediate(program, m_name):
        raise IllegalActionError(f"{m_name} is not an intermediate written by one earlier nest")
    site = _max_site(program, writers[0])
    renaming = positional_renaming(nest.loops, site.nest.loops)
    if renaming is None:
        raise IllegalActionError(f"nests {site.index} and {index} run different loops")
    loops = site.nest.loops
    same = (_pinned(rename_vars(arg.lhs, renaming), loops) == _pinned(site.x, loops)
            and _pinned(rename_vars(arg.rhs, renaming), loops) == _pinned(site.eq.lhs, loops)
            and renaming[red.reduced_vars[0]] == site.var)
    if not same:
        raise IllegalActionError(f"the exponent in nest {index} is not (x - M) with x the values nest "
                                 f"{site.index} maximizes over the same loop")
    s = rename_vars(eq.lhs, renaming)
    x_reads = {a.name for a in accesses(site.x)}
    for j in range(site.index + 1, index):
        between = program.nests[j]
        if x_reads & set(writes(between)) or s.name in reads(between) + writes(between):
            raise IllegalActionError(f"nest {j} between the two passes writes what they read or touches {s.name}")
    return _Chain(site, index, s)


def _fused_pass(chain: _Chain, sum_name: str, guard: int, scope: str = "g") -> tuple[Nest, _Scan, _Scan]:
    """One nest over the max nest's loops holding the running max (M itself, one rank more) and the rescaled
    running sum (tensor `sum_name`)."""
    site = chain.site
    m = _scan_of(site, site.eq.lhs, site.eq.lhs.name, scope)
    s = _scan_of(site, chain.s, sum_name, scope)
    return Nest(site.nest.loops, (_running_max(m, site.x), _rescaled_sum(m, s, site.x, guard))), m, s


STATES = ("scan", "inplace")
"""How online_softmax and flashattention_wo_tiling keep their running values: `scan` one element per step (the
reference's form), `inplace` one per row, updated in place with per-step factors in local scalars."""


def _state(action: Action) -> str:
    value = action["state"]
    if value not in STATES:
        raise IllegalActionError(f"state must be one of {', '.join(STATES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class _Running:
    """In-place running maximum and sum of a chain: `init` (M=-inf, S=0 per row) and the per-step equations
    Mp=M; M=max(Mp,x); R=exp(Mp-M); E=exp(x-M); S=S*R+E, with Mp, R, E local scalars."""

    init: tuple[Equation, ...]
    step: tuple[Equation, ...]
    rescale: Access
    share: Access


def _running(chain: _Chain, names: list[str], guard: int) -> _Running:
    site = chain.site
    m, s = site.eq.lhs, chain.s
    before, rescale, share = (Access(name, m.dtype, "l", ()) for name in names)
    factors = (Call("exp", (BinOp("-", before, m),)), Call("exp", (BinOp("-", site.x, m),)))
    guarded = [finite_guard(m, f) if guard else f for f in factors]
    step = (Equation(before, m), Equation(m, Call("max", (before, site.x))), Equation(rescale, guarded[0]),
            Equation(share, guarded[1]), Equation(s, BinOp("+", BinOp("*", s, rescale), share)))
    return _Running((Equation(m, MINUS_INF), Equation(s, Const(0))), step, rescale, share)


def _fresh_names(program: Program, count: int) -> list[str]:
    names: list[str] = []
    for _ in range(count):
        names.append(fresh_tensor(program, set(names)))
    return names


def _guard_site(program: Program, chain: _Chain) -> int:
    """1 when the first element of some scanned row may be -inf (masked scores), so the unguarded online
    recurrence would compute exp(-inf-(-inf)) = NaN; 0 when the analysis proves it finite."""
    site = chain.site
    first = substitute(site.x, {site.var: Const(0)})
    bounds = bounds_of(site.outer)
    kinds = ValueFacts(program).kinds(first, bounds)
    return 0 if kinds <= FINITE | {POS_INF} else 1


def _rounding_note(what: str = "the sum is") -> str:
    return (f"Not bitwise: {what} accumulated in rescaled form (one extra multiply and exp per step), so rounding "
            "changes and results differ from the two-pass form by a few ulps; verification decides.")


def _guard_note(program: Program, chain: _Chain, guard: int) -> str:
    proven = not _guard_site(program, chain)
    if guard:
        return (" Each rescaled value is guarded by if_then_else(M>-inf, ..., 0)"
                + ("." if proven else ", because the analysis cannot prove the first element of every row finite "
                   "(a masked score may be -inf)."))
    if proven:
        return (" The analysis proves the first element of every row finite, so exp(M_prev - M) never computes "
                "-inf - (-inf).")
    return (" Unguarded although the analysis cannot prove the first element of every row finite: a row that "
            "starts with -inf gives NaN (the reference's form; candidates guard it).")


@register
class NormalLoopMaxToPrefixMax(Strategy):
    """Turn the max reduction of nest `nest` into a prefix (scan) maximum: a fresh tensor keeps the running
    maximum at every step of the reduced loop, and a copy nest stores its last step under the old name.

    Preconditions: the nest is flat with one equation, a float max reduction over exactly one loop, and that
    loop is serial (a scan must run in order)."""

    name = "normal_loop_max_to_prefix_max"
    params = ("nest",)

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        return [self.action(nest=i) for i in range(len(program.nests)) if _quiet(_max_site, program, i)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        site = _max_site(program, _int(action, "nest"))
        scan = _scan_of(site, site.eq.lhs, fresh_tensor(program), "g")
        nests = (Nest(site.nest.loops, (_running_max(scan, site.x),)), _copy_last(site.outer, site.eq.lhs, scan))
        return program.replace_nests(program.nests[:site.index] + nests + program.nests[site.index + 1:])

    def explain(self, before: Program, action: Action, after: Program) -> str:
        site = _max_site(before, action["nest"])
        scan = writes(after.nests[site.index])[0]
        rows = trip_count(site.outer)
        return (f"normal_loop_max_to_prefix_max turned the max reduction of nest {site.index} "
                f"({site.eq.lhs.name} = max over {site.var} of {print_expr(site.x)}, loops "
                f"{describe_loops(site.nest.loops)}) into a prefix maximum: {scan} keeps the running maximum "
                f"after every step of {site.var}, reading its predecessor (-inf before the first step), and a "
                f"new nest copies step {site.extent - 1} into {site.eq.lhs.name}. It is legal because the "
                f"reduction runs over the single serial loop {site.var}, so the running maximum after the last "
                f"step is the reduction's value, and max is exact (bitwise identical results). The values are "
                f"still read in one pass, but {rows * site.extent} running maxima are stored instead of {rows} "
                "and a copy pass is added: slower on its own; it exposes the running maximum that "
                "online_softmax and flashattention_wo_tiling rescale against.")


class _ChainStrategy(Strategy):
    """Shared machinery of the strategies anchored at the sum-of-exp nest of a softmax chain."""

    params = ("nest", "guard")

    def site(self, program: Program, index):
        raise NotImplementedError

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests)):
            site = _quiet(self.site, program, i)
            if site is not None:
                found += [self.action(**params) for params in self.menu(program, site)]
        return found

    def menu(self, program: Program, site) -> list[dict]:
        return [{"nest": site.chain.index, "guard": _guard_site(program, site.chain)}]

    def infer(self, before: Program, after: Program) -> list[Action]:
        """The other guard setting at every site (the reference never guards)."""
        found = []
        for action in self.candidates(before):
            params = dict(action.params)
            found.append(self.action(**dict(params, guard=1 - params["guard"])))
        return found


@register
class NormalLoopSummationOnExpToPrefixSummationOnExp(_ChainStrategy):
    """Turn the sum of exp(x - M) in nest `nest` (M the max of x over the same loop, from an earlier nest) into
    a prefix sum fused with the prefix maximum: one nest keeps, per step, the running maximum (M itself, one
    rank more) and the running sum rescaled to it; a copy nest stores the last step of the sum under the old
    name; later reads of M read its last step. `guard=1` guards the rescaling against rows whose elements so
    far are all -inf.

    Preconditions: the sum is a flat one-equation reduction over one loop of exp(x - M); M is an intermediate
    written only by a flat max reduction of the same x over the same loops (serial reduced loop); nests in
    between do not write what x reads nor touch the sum."""

    name = "normal_loop_summation_on_exp_to_prefix_summation_on_exp"

    def site(self, program: Program, index) -> _Chain:
        return _chain(program, index)

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        chain = _chain(program, _int(action, "nest"))
        site = chain.site
        fused, m, s = _fused_pass(chain, fresh_tensor(program), _flag(action, "guard"))
        copy = _copy_last(site.outer, chain.s, s)
        later = _last_step({m.access.name: m})
        rest = [_map_accesses(n, later) for j, n in enumerate(program.nests) if j > site.index and j != chain.index]
        return program.replace_nests(program.nests[:site.index] + (fused, copy) + tuple(rest))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        chain = _chain(before, action["nest"])
        site = chain.site
        return (f"normal_loop_summation_on_exp_to_prefix_summation_on_exp rewrote the sum {chain.s.name} = "
                f"sum over {site.var} of exp({print_expr(site.x)} - {site.eq.lhs.name}) (nest {chain.index}) as a "
                f"prefix sum fused with the maximum of nest {site.index}: one nest now keeps, per step of "
                f"{site.var}, the running maximum M_r = max(M_(r-1), x_r) and the running sum "
                "S_r = S_(r-1)*exp(M_(r-1)-M_r) + exp(x_r-M_r), which equals the sum of exp(x_k-M_r) over the "
                f"steps so far; a copy nest stores the last step into {chain.s.name}, and later reads of "
                f"{site.eq.lhs.name} read its last step. It is legal because use-def shows "
                f"{site.eq.lhs.name} is written only by the max reduction of the same values over the same loop, "
                "so at the last step M_r is the row maximum and S_r the old sum. Passes over x: two (max, "
                f"sum) become one, at the cost of an extra exp per element and {trip_count(site.nest.loops)} "
                f"stored running values per tensor. {_rounding_note()}"
                f"{_guard_note(before, chain, action['guard'])}")


@register
class OnlineSoftmax(_ChainStrategy):
    """Online softmax: fuse the max pass and the sum-of-exp pass anchored at nest `nest` into one pass that
    keeps a running maximum and rescales the running sum (m_new = max(m, x); s = s*exp(m-m_new) +
    exp(x-m_new)); every later read of the maximum or the sum reads the last step of the running values.
    `guard=1` guards the rescaling against rows whose elements so far are all -inf.

    Preconditions: those of normal_loop_summation_on_exp_to_prefix_summation_on_exp, and the sum is an
    intermediate written only by its nest."""

    name = "online_softmax"
    params = ("nest", "guard", "state")

    def menu(self, program: Program, site: _Chain) -> list[dict]:
        return [dict(params, state=state) for params in super().menu(program, site) for state in STATES]

    def site(self, program: Program, index) -> _Chain:
        chain = _chain(program, index)
        if not _is_intermediate(program, chain.s.name) or _writer_nests(program, chain.s.name) != [chain.index]:
            raise IllegalActionError(f"{chain.s.name} is a signature tensor or written elsewhere; its reads "
                                     "cannot be redirected to the running sum")
        return chain

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        chain = self.site(program, _int(action, "nest"))
        site = chain.site
        guard, state = _flag(action, "guard"), _state(action)
        rest = [n for j, n in enumerate(program.nests) if j > site.index and j != chain.index]
        if state == "inplace":
            run = _running(chain, _fresh_names(program, 3), guard)
            fused = (Nest(site.outer, run.init), Nest(site.nest.loops, run.step))
        else:
            scans, m, s = _fused_pass(chain, fresh_tensor(program), guard)
            fused = (scans,)
            rest = [_map_accesses(n, _last_step({m.access.name: m, chain.s.name: s})) for n in rest]
        return program.replace_nests(program.nests[:site.index] + fused + tuple(rest))

    def explain(self, before: Program, action: Action, after: Program) -> str:
        chain = self.site(before, action["nest"])
        site = chain.site
        readers = sorted(set(_reader_nests(before, chain.s.name) + _reader_nests(before, site.eq.lhs.name))
                         - {chain.index})
        return (f"online_softmax fused the max pass (nest {site.index}: {site.eq.lhs.name} = max over {site.var} "
                f"of {print_expr(site.x)}) and the sum-of-exp pass (nest {chain.index}: {chain.s.name} = sum of "
                f"exp(x - {site.eq.lhs.name})) into one pass over {site.var} ({site.extent} steps, "
                f"{trip_count(site.outer)} rows) that keeps the running maximum m_r = max(m_(r-1), x_r) and "
                "rescales the running sum, s_r = s_(r-1)*exp(m_(r-1)-m_r) + exp(x_r-m_r). "
                + (f"Both are kept per step (scan tensors); the reads in nest{'s' if len(readers) > 1 else ''} "
                   f"{', '.join(map(str, readers))} now take the last step. " if action["state"] == "scan" else
                   f"Both are kept once per row and updated in place (a nest first sets {site.eq.lhs.name} to -inf "
                   f"and {chain.s.name} to 0; the per-step factors live in local scalars), so the reads in nest"
                   f"{'s' if len(readers) > 1 else ''} {', '.join(map(str, readers))} are unchanged. ")
                + "It is legal because use-def shows the exponent subtracts exactly the "
                "maximum of the same values over the same loop and both tensors are intermediates read only at "
                "their final values, where the running maximum is the row maximum and the rescaled sum equals "
                "the old sum. The max pass and the sum pass over x become one pass (later reads of x, as in a "
                "normalisation, remain); each element costs one more exp"
                + (", and the running values are stored per step. " if action["state"] == "scan" else ". ")
                + 
                f"{_rounding_note()}{_guard_note(before, chain, action['guard'])}")


# -- flashattention_wo_tiling ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Attention:
    """A softmax chain whose probabilities P = exp(x - M)/S (nest `norm`) are read only by the reduction
    O = O + P*w over the key loop (nest `pv`). `to_fused` maps the PV nest's variables to expressions over the
    max nest's loops and the `head` loops (the PV loops P does not index: the head dimension)."""

    chain: _Chain
    norm: int
    pv: int
    out: Access
    weight: Expr
    key: str
    to_fused: tuple[tuple[str, Expr], ...]
    head: tuple[Loop, ...]

    @property
    def index(self) -> int:
        return self.chain.index

    def fused(self, expr: Expr) -> Expr:
        return substitute(expr, dict(self.to_fused))


def _normalisation(program: Program, chain: _Chain, n: int) -> tuple[Access, dict[str, str]]:
    """The probabilities P = exp(x - M)/S of nest `n` and the renaming of its loops to the max nest's."""
    site = chain.site
    nest = program.nests[n]
    eq = single_equation(nest)
    renaming = positional_renaming(nest.loops, site.nest.loops) if eq is not None else None
    rhs = eq.rhs if eq is not None else None
    ok = (renaming is not None and isinstance(rhs, BinOp) and rhs.op == "/" and isinstance(rhs.lhs, Call)
          and rhs.lhs.func == "exp" and isinstance(rhs.lhs.args[0], BinOp) and rhs.lhs.args[0].op == "-")
    if ok:
        loops = site.nest.loops
        arg = rhs.lhs.args[0]
        pairs = ((arg.lhs, site.x), (arg.rhs, site.eq.lhs), (rhs.rhs, chain.s))
        ok = all(_pinned(rename_vars(a, renaming), loops) == _pinned(b, loops) for a, b in pairs)
    if not ok:
        raise IllegalActionError(f"nest {n} does not compute exp(x - {site.eq.lhs.name})/{chain.s.name} over the "
                                 "same loops")
    p = eq.lhs
    names = [i.name for i in p.indices if isinstance(i, Var)]
    if len(names) != p.rank or len(set(names)) != p.rank or set(names) != {l.var for l in nest.loops}:
        raise IllegalActionError(f"{p.name} is not written one element per iteration of nest {n}")
    if not _is_intermediate(program, p.name) or _writer_nests(program, p.name) != [n]:
        raise IllegalActionError(f"{p.name} is a signature tensor or written by other nests")
    return p, renaming


def _weighted_sum(program: Program, p: Access, pv: int) -> tuple[Equation, str, Access, Expr]:
    """The reduction O = O + P_r*w of nest `pv` over one key loop: (equation, key, P read, w)."""
    nest = program.nests[pv]
    eq = single_equation(nest)
    red = reduction(nest.loops, eq) if eq is not None else None
    operand = red.operand if red is not None else None
    if red is None or red.op != "+" or len(red.reduced_vars) != 1 or not isinstance(operand, BinOp) \
            or operand.op != "*":
        raise IllegalActionError(f"nest {pv} is not a sum over one loop of a product")
    for prob, weight in ((operand.lhs, operand.rhs), (operand.rhs, operand.lhs)):
        if isinstance(prob, Access) and prob.name == p.name and p.name not in {a.name for a in accesses(weight)}:
            names = [i.name for i in eq.lhs.indices if isinstance(i, Var)]
            if len(names) != eq.lhs.rank or len(set(names)) != len(names):
                raise IllegalActionError(f"{eq.lhs.name} is not written at plain loop variables")
            return eq, red.reduced_vars[0], prob, weight
    raise IllegalActionError(f"nest {pv} does not multiply {p.name} by a weight that does not read it")


def _pv_mapping(site: _MaxSite, write_vars: list[str], prob: Access, pv_nest: Nest, key: str,
                taken: set[str]) -> tuple[dict[str, Expr], tuple[Loop, ...]]:
    """PV variable -> expression over the fused nest's loops, and the head loops P does not index."""
    extents = bounds_of(site.nest.loops)
    pv_extents = bounds_of(pv_nest.loops)
    mapping: dict[str, Expr] = {}
    for wv, index in zip(write_vars, prob.indices):
        if isinstance(index, Var) and mapping.get(index.name, Var(wv)) == Var(wv) \
                and pv_extents.get(index.name) == extents[wv]:
            mapping[index.name] = Var(wv)
        elif not (index == Const(0) and extents[wv] == 1):
            raise IllegalActionError(f"{prob.name} is read at {print_expr(prob)}, not at one element per "
                                     "probability the normalisation writes")
    if mapping.get(key) != Var(site.var):
        raise IllegalActionError(f"the weighted sum runs over {key}, not over the key loop {site.var}")
    head = []
    for loop in pv_nest.loops:
        if loop.var in mapping:
            continue
        if loop.extent == 1:
            mapping[loop.var] = Const(0)
            continue
        var = fresh_loop_var(site.nest, taken)
        taken.add(var)
        head.append(Loop("L", loop.extent, var))
        mapping[loop.var] = Var(var)
    return mapping, tuple(head)


def _attention(program: Program, index) -> _Attention:
    chain = _chain(program, index)
    site = chain.site
    m_name, s_name = site.eq.lhs.name, chain.s.name
    if not _is_intermediate(program, s_name) or _writer_nests(program, s_name) != [chain.index]:
        raise IllegalActionError(f"{s_name} is a signature tensor or written elsewhere")
    norms = _reader_nests(program, s_name)
    if len(norms) != 1 or _reader_nests(program, m_name, exclude=(chain.index, norms[0])):
        raise IllegalActionError(f"{m_name} and {s_name} must be read only by the sum and one normalisation")
    n = norms[0]
    p, renaming = _normalisation(program, chain, n)
    pvs = _reader_nests(program, p.name)
    if len(pvs) != 1 or pvs[0] <= n:
        raise IllegalActionError(f"{p.name} must be read by exactly one later nest")
    pv = pvs[0]
    eq, key, prob, weight = _weighted_sum(program, p, pv)
    write_vars = [renaming[i.name] for i in p.indices]
    mapping, head = _pv_mapping(site, write_vars, prob, program.nests[pv], key, set())
    moved = {a.name for a in accesses(site.x)} | {a.name for a in accesses(weight)}
    for j in range(site.index + 1, pv):
        if j in (chain.index, n):
            continue
        touched = set(reads(program.nests[j]) + writes(program.nests[j]))
        if moved & set(writes(program.nests[j])) or touched & {m_name, s_name, p.name, eq.lhs.name}:
            raise IllegalActionError(f"nest {j} lies between the passes and writes what they read or touches "
                                     "their tensors")
    return _Attention(chain, n, pv, eq.lhs, weight, key, tuple(mapping.items()), head)


def _in_head(att: _Attention, eq: Equation) -> Statement:
    """`eq` inside the head loops (if any)."""
    return Nest(att.head, (eq,)) if att.head else eq


def _flash_scan(program: Program, att: _Attention, guard: int, final_loops: tuple[Loop, ...]) -> list[Nest]:
    """The reference's form: running maximum, sum and normalised output kept per key,
    o_k = o_(k-1)*s_(k-1)*exp(m_(k-1)-m_k)/s_k + exp(x_k-m_k)/s_k*w_k, then a copy of the last key."""
    site = att.chain.site
    s_name, o_name = _fresh_names(program, 2)
    passes, m, s = _fused_pass(att.chain, s_name, guard, scope="l")
    written = att.fused(att.out)
    out = _Scan(Access(o_name, att.out.dtype, "g", written.indices + (Var(site.var),)), written.rank, site.extent)
    growth = Call("exp", (BinOp("-", m.prev(MINUS_INF), m.access),))
    share = Call("exp", (BinOp("-", site.x, m.access),))
    rescaled = BinOp("/", BinOp("*", BinOp("*", out.prev(Const(1)), s.prev(Const(1))), growth), s.access)
    value = BinOp("+", rescaled, BinOp("*", BinOp("/", share, s.access), att.fused(att.weight)))
    update = Equation(out.access, finite_guard(m.access, value) if guard else value)
    return [replace(passes, body=passes.body + (_in_head(att, update),)), _copy_last(final_loops, att.out, out)]


def _flash_inplace(program: Program, att: _Attention, guard: int, final_loops: tuple[Loop, ...]) -> list[Nest]:
    """One running maximum, sum and unnormalised output per row (and head element), updated in place:
    o = o*exp(m_old-m) + exp(x-m)*w per key, o/s at the end."""
    site = att.chain.site
    run = _running(att.chain, _fresh_names(program, 3), guard)
    out = att.fused(att.out)
    init = Nest(site.outer, run.init + (_in_head(att, Equation(out, Const(0))),))
    update = Equation(out, BinOp("+", BinOp("*", out, run.rescale), BinOp("*", run.share, att.fused(att.weight))))
    back = {v.name: Var(k) for k, v in att.to_fused if isinstance(v, Var)}
    total = substitute(att.chain.s, {l.var: back.get(l.var, Const(0)) for l in site.outer})
    final = Nest(final_loops, (Equation(att.out, BinOp("/", att.out, total)),))
    return [init, Nest(site.nest.loops, run.step + (_in_head(att, update),)), final]


def _copy_order(att: _Attention, program: Program, order) -> tuple[Loop, ...]:
    loops = {l.var: l for l in program.nests[att.pv].loops if l.var != att.key}
    if not isinstance(order, tuple) or sorted(order) != sorted(loops):
        raise IllegalActionError(f"order must list the loops {', '.join(loops)} of the weighted sum other than "
                                 f"{att.key}, got {order!r}")
    return tuple(loops[v] for v in order)


@register
class FlashattentionWoTiling(_ChainStrategy):
    """Flash attention without tiling: the max pass, the sum-of-exp pass (nest `nest`), the normalisation
    P = exp(x-M)/S and the weighted sum O = sum over keys of P*w become one pass over the keys that keeps the
    running maximum and sum and rescales the output accumulator whenever the maximum grows (per head element,
    an inner loop). `state=scan` keeps every running value per key, the output normalised at each step, and a
    copy nest stores the last step into O (the reference's form); `state=inplace` keeps one running value per
    row and head element, accumulates the unnormalised output in O itself, and divides it by the sum at the
    end. The final nest runs its loops in `order`. `guard=1` guards the rescaling against rows whose scores so
    far are all -inf.

    Preconditions: a softmax chain (see online_softmax) whose maximum and sum are read only by the sum and one
    normalisation nest, whose probabilities are an intermediate read only by one later flat reduction
    O = O + P*w over the key loop, with O written at plain loop variables; nests in between neither write
    what the scores or w read nor touch M, S, P or O."""

    name = "flashattention_wo_tiling"
    params = ("nest", "guard", "order", "state")

    def site(self, program: Program, index) -> _Attention:
        return _attention(program, index)

    def menu(self, program: Program, site: _Attention) -> list[dict]:
        order = tuple(l.var for l in program.nests[site.pv].loops if l.var != site.key)
        return [dict(params, order=order, state=state) for params in super().menu(program, site) for state in STATES]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        att = _attention(program, _int(action, "nest"))
        guard, state = _flag(action, "guard"), _state(action)
        final_loops = _copy_order(att, program, action["order"])
        fused = (_flash_inplace if state == "inplace" else _flash_scan)(program, att, guard, final_loops)
        nests = []
        for j, nest in enumerate(program.nests):
            if j == att.pv:
                nests += fused
            elif j not in (att.chain.site.index, att.index, att.norm):
                nests.append(nest)
        return program.replace_nests(nests)

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Both guard settings of the scan form, with the copy nest's loop order read off `after` (the
        reference draws it at random)."""
        found = []
        for action in super().infer(before, after) + self.candidates(before):
            att = _attention(before, action["nest"])
            for nest in after.nests:
                eq = single_equation(nest)
                if eq is None or eq.lhs.name != att.out.name or not isinstance(eq.rhs, Access) \
                        or len(nest.loops) != att.out.rank:
                    continue
                rename = {i.name: o.name for i, o in zip(eq.lhs.indices, att.out.indices) if isinstance(i, Var)}
                order = tuple(rename.get(l.var, l.var) for l in nest.loops)
                found.append(self.action(**dict(dict(action.params), order=order, state="scan")))
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        att = _attention(before, action["nest"])
        site = att.chain.site
        rows, keys = trip_count(site.outer), site.extent
        width = trip_count(att.head)
        p_name = writes(before.nests[att.norm])[0]
        scan = action["state"] == "scan"
        form = (f"the normalised output o_k = o_(k-1)*s_(k-1)*exp(m_(k-1)-m_k)/s_k + exp(x_k-m_k)/s_k*w_k, all "
                "kept per key (the maximum and sum in local storage), two exponentials and two divisions per head "
                f"element as the reference writes it, and a copy nest stores the last key into {att.out.name}"
                if scan else
                f"the unnormalised output o = o*exp(m_old-m) + exp(x-m)*w, kept once per row in {att.out.name} "
                "itself with the two per-key factors in local scalars, and divided by the sum once at the end")
        return (f"flashattention_wo_tiling fused the attention chain around the sum in nest {att.index}: nests "
                f"{site.index} (row maximum {site.eq.lhs.name} of the scores {print_expr(site.x)}), {att.index} "
                f"(sum of exp), {att.norm} (probabilities {p_name}) and {att.pv} ({att.out.name} = sum over "
                f"{att.key} of {p_name} * {print_expr(att.weight)}) into one pass over the {keys} keys of each of "
                f"the {rows} rows. Per key it updates the running maximum m, the rescaled running sum s and, for "
                f"each of the {width} head elements, {form}; after the last key the output equals the "
                "softmax-weighted sum. It is legal because use-def shows the maximum and the sum are read only by "
                f"the normalisation, and {p_name} only by the weighted sum over the key loop, so no other nest "
                f"needs them. The {rows * keys} probabilities are no longer written and read back, and four passes "
                "over the scores become one, at the cost of a rescale per key and head element. "
                f"{_rounding_note('the sum and the output are')}{_guard_note(before, att.chain, action['guard'])}")


# -- exponential_split / additive_split / multiplicative_split --------------------------------------------------------

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
        site = self.site(program, _int(action, "nest"), action["path"])
        p = self.split_value(program, site, action["by"], action["at"], _flag(action, "shift"), facts)
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
                    if _quiet(self.plan, program, action, facts) is not None:
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
                  f"{by} is written by nest{'s' if len(_writer_nests(before, by)) > 1 else ''} "
                  f"{', '.join(map(str, _writer_nests(before, by)))}, whose values the analysis bounds to "
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
    writers = _writer_nests(program, name)
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



# -- partially_equivalent_then_correct -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pad:
    """`P_{v} = if_then_else(cond, S_{v-offsets}, fill)` in flat nest `index`: a padded copy of S."""

    index: int
    nest: Nest
    target: Access
    cond: Expr
    source: Access
    fill: Expr

    def offset(self, dim: int) -> int | None:
        index, var = self.source.indices[dim], self.target.indices[dim]
        if index == var:
            return 0
        if isinstance(index, BinOp) and index.op == "-" and index.lhs == var and isinstance(index.rhs, Const) \
                and index.rhs.is_int:
            return index.rhs.value
        return None


def _pad(program: Program, name: str) -> _Pad | None:
    """The padded copy `name` (one nest writing if_then_else(in range, S at constant offsets, fill) at its loop
    variables), or None where `name` is anything else."""
    writers = _writer_nests(program, name)
    eq = single_equation(program.nests[writers[0]]) if len(writers) == 1 else None
    rhs = eq.rhs if eq is not None else None
    if not (isinstance(rhs, Call) and rhs.func == "if_then_else" and isinstance(rhs.args[1], Access)
            and rhs.args[1].rank == eq.lhs.rank and rhs.args[1].name != name and not list(accesses(rhs.args[2]))):
        return None
    nest = program.nests[writers[0]]
    names = [i.name for i in eq.lhs.indices if isinstance(i, Var)]
    if len(names) != eq.lhs.rank or sorted(names) != sorted(l.var for l in nest.loops):
        return None
    pad = _Pad(writers[0], nest, eq.lhs, rhs.args[0], rhs.args[1], rhs.args[2])
    return pad if all(pad.offset(d) is not None for d in range(eq.lhs.rank)) else None


def _range_chain(cond: Expr, var: str) -> list[Compare]:
    """The `lo<=v<hi` chains of a conjunction that mention loop variable `var`."""
    if isinstance(cond, And):
        return _range_chain(cond.lhs, var) + _range_chain(cond.rhs, var)
    return [cond] if isinstance(cond, Compare) and var in free_vars(cond) else []


def _widen(cond: Expr, chain: Compare | None, extra: int) -> Expr:
    """`cond` with the upper bound of `chain` raised by `extra`."""
    if cond is chain:
        hi = chain.operands[2]
        return replace(chain, operands=chain.operands[:2] + (Const(hi.value + extra),))
    if isinstance(cond, And):
        return replace(cond, lhs=_widen(cond.lhs, chain, extra), rhs=_widen(cond.rhs, chain, extra))
    return cond


def _at(expr: Expr, var: str, index: Expr) -> Expr:
    """`expr` with loop variable `var` replaced by `index`, parenthesized where it is part of a larger
    subscript (`c+f` -> `(c+512)+f`, a whole subscript `c` -> `c+512`), as the reference writes it."""
    if isinstance(expr, Access):
        inner = replace(index, parens=1)
        return replace(expr, indices=tuple(index if i == Var(var) else substitute(i, {var: inner})
                                           for i in expr.indices))
    if expr == Var(var):
        return index
    return map_children(expr, lambda k: _at(k, var, index))


@dataclass(frozen=True)
class _Shared:
    """Two reductions X1 = reduce(e(T1)) (nest `first`) and X2 = reduce(e(T2)) (nest `second`, variables renamed
    to the first's) that differ only in the tensor they read, T1 or T2, concatenated along dimension `dim`.
    The reads index `dim` by output variable `out` plus (in a window of `window` elements) a reduced one.
    With `pads`, T1 and T2 are identical paddings (`lo` before, `hi` after along `dim`) of sources of length
    `n`, and the sources are concatenated and padded once; otherwise T1 and T2 themselves (length `n`)."""

    first: int
    second: int
    eq1: Equation
    eq2: Equation
    op: str
    operands: tuple[str, str]
    pads: tuple[_Pad, _Pad] | None
    dim: int
    out: str
    window: int
    n: int
    lo: int
    hi: int
    chain: Compare | None
    outputs: tuple[Loop, ...]

    @property
    def earliest(self) -> int:
        """Where the shared block goes: before the first nest of the group (reductions and paddings)."""
        return min([self.first] + [p.index for p in self.pads or ()])

    @property
    def extent(self) -> int:
        return next(l.extent for l in self.outputs if l.var == self.out)

    @property
    def wrong(self) -> tuple[int, int]:
        """How many outputs of X1 (the last ones) and of X2 (the first ones) read across the seam in the shared
        form: X1's windows that reach past S1 plus its padding before, X2's that start in its padding before."""
        return max(0, self.extent - max(0, self.lo + self.n - self.window + 1)), min(self.lo, self.extent)

    def copied(self, extra: int) -> int:
        """How many outputs of each the copy nest takes from the shared result: half of it each, the second
        output's aligned to its end (the reference's split), where the correction recomputes the rest; else all."""
        half = min((self.extent + self.n) // 2, self.extent)
        return half if self.extent - half <= min(self.recomputed(extra)) else self.extent

    def recomputed(self, extra: int) -> tuple[int, int]:
        """Outputs of X1 and X2 the correction recomputes: the wrong ones and `extra` more where any is."""
        return tuple(w + extra if w else 0 for w in self.wrong)


def _differing(program: Program, first, second) -> tuple[Equation, Equation, str, str, str, tuple[str, ...]]:
    """Two flat one-equation reductions with the same operator and loops whose values differ only in the tensor
    they read: (eq1, eq2 in the first's variables, operator, T1, T2, reduced variables)."""
    one, two = nest_at(program, first), nest_at(program, second)
    if not isinstance(first, int) or not isinstance(second, int) or not first < second:
        raise IllegalActionError("other must be a later nest than nest")
    eq1, eq2 = single_equation(one), single_equation(two)
    red1 = reduction(one.loops, eq1) if eq1 is not None else None
    red2 = reduction(two.loops, eq2) if eq2 is not None else None
    renaming = positional_renaming(two.loops, one.loops)
    if red1 is None or red2 is None or red1.op != red2.op or renaming is None:
        raise IllegalActionError(f"nests {first} and {second} are not the same kind of reduction over the same loops")
    eq2 = Equation(rename_vars(eq2.lhs, renaming), rename_vars(eq2.rhs, renaming))
    operand2 = reduction(one.loops, eq2).operand
    pairs = {(a.name, b.name) for a, b in zip(accesses(red1.operand), accesses(operand2)) if a.name != b.name}
    if len(pairs) != 1 or eq1.lhs.indices != eq2.lhs.indices or eq1.lhs.name == eq2.lhs.name:
        raise IllegalActionError(f"nests {first} and {second} do not apply one operator to two different tensors")
    (t1, t2), = pairs
    if replace_accesses(operand2, lambda a: replace(a, name=t1) if a.name == t2 else a) != red1.operand:
        raise IllegalActionError(f"nests {first} and {second} differ elsewhere than in {t1} and {t2}")
    if {t1, t2} & {eq1.lhs.name, eq2.lhs.name}:
        raise IllegalActionError(f"nests {first} and {second} read their own targets through {t1} or {t2}")
    return eq1, eq2, red1.op, t1, t2, red1.reduced_vars


def _slide(reads_: list[Access], dim: int, reduced: tuple[str, ...]) -> tuple[str, str | None]:
    """(output variable, reduced window variable or None) when every read's subscript at `dim` is `o` or
    `o+w` (unit stride and dilation)."""
    found = set()
    for acc in reads_:
        index = acc.indices[dim]
        terms = (index.lhs, index.rhs) if isinstance(index, BinOp) and index.op == "+" else (index,)
        names = tuple(t.name for t in terms if isinstance(t, Var))
        outer = [v for v in names if v not in reduced]
        if len(names) != len(terms) or len(outer) != 1 or len(names) - 1 != len(set(names) & set(reduced)):
            raise IllegalActionError(f"{print_expr(acc)} does not read dimension {dim} at an output variable (plus a "
                                     "window variable)")
        found.add((outer[0], next((v for v in names if v in reduced), None)))
    if len(found) != 1:
        raise IllegalActionError(f"the reads index dimension {dim} differently")
    return found.pop()


def _padding(program: Program, t1: str, t2: str) -> tuple[_Pad, _Pad] | None:
    """Both padded copies when T1 and T2 are the same padding of two same-shaped sources, else None."""
    pads = (_pad(program, t1), _pad(program, t2))
    if None in pads:
        return None
    s1, s2 = pads[0].source, pads[1].source
    rename = positional_renaming(pads[1].nest.loops, pads[0].nest.loops)
    same = rename is not None and replace_accesses(
        rename_vars(pads[1].nest.body[0].rhs, rename),
        lambda a: replace(a, name=s1.name) if a.name == s2.name else a) == pads[0].nest.body[0].rhs
    shapes = [program.tensors[s.name].shape for s in (s1, s2)]
    return pads if same and shapes[0] == shapes[1] and s1.name != s2.name else None


def _shared(program: Program, first, second, dim) -> _Shared:
    eq1, eq2, op, t1, t2, reduced = _differing(program, first, second)
    shape = program.tensors[t1].shape
    if program.tensors[t2].shape != shape or not isinstance(dim, int) or not 0 <= dim < len(shape):
        raise IllegalActionError(f"{t1} and {t2} differ in shape or have no dimension {dim!r}")
    operand = reduction(program.nests[first].loops, eq1).operand
    out, window = _slide([a for a in accesses(operand) if a.name == t1], dim, reduced)
    if any(out in free_vars(i) for a in accesses(operand) for d, i in enumerate(a.indices)
           if a.name != t1 or d != dim) or Var(out) not in eq1.lhs.indices:
        raise IllegalActionError(f"other operands read along {out}, or the result is not written at {out}: only "
                                 f"{t1} and {t2} can be concatenated along it")
    loops = program.nests[first].loops
    outputs = tuple(l for l in loops if l.var not in reduced)
    width = program.nests[first].loop(window).extent if window else 1
    pads = _padding(program, t1, t2)
    n, lo, hi, chain = shape[dim], 0, 0, None
    if pads is not None:
        var = pads[0].target.indices[dim].name
        chains = _range_chain(pads[0].cond, var)
        n, lo = program.tensors[pads[0].source.name].shape[dim], pads[0].offset(dim)
        hi = shape[dim] - n - lo
        chain = chains[0] if chains else None
        exact = not chains and lo == hi == 0 or len(chains) == 1 and chain.ops == ("<=", "<") \
            and chain.operands == (Const(lo), Var(var), Const(lo + n))
        if not exact or hi < 0:
            raise IllegalActionError(f"the padding of {t1} along dimension {dim} is not lo<=v<lo+n")
    plan = _Shared(first, second, eq1, eq2, op, (t1, t2), pads, dim, out, width, n, lo, hi, chain, outputs)
    _check_placement(program, plan)
    return plan


def _check_placement(program: Program, plan: _Shared) -> None:
    """The shared block runs at `earliest`, the corrections at `second`: what the block reads must be complete
    by then, and the outputs must not be touched in between where that would see them early or uncorrected."""
    x1, x2 = plan.eq1.lhs.name, plan.eq2.lhs.name
    sources = [p.source.name for p in plan.pads] if plan.pads else list(plan.operands)
    inputs = {a.name for a in accesses(plan.eq1.rhs)} - {x1, *plan.operands} | set(sources)
    late = sorted(name for name in inputs if any(w >= plan.earliest for w in _writer_nests(program, name)))
    if late:
        raise IllegalActionError(f"{', '.join(late)} {'is' if len(late) == 1 else 'are'} not complete before nest "
                                 f"{plan.earliest}, where the shared form would run")
    for name, own in ((x1, plan.first), (x2, plan.second)):
        if min(_writer_nests(program, name)) != own:
            raise IllegalActionError(f"{name} is written before its reduction (nest {own})")
    corrected = plan.wrong[0] > 0
    for k in range(plan.earliest, plan.second):
        touched = set(reads(program.nests[k]) + writes(program.nests[k]))
        if k != plan.first and (x2 in touched or x1 in touched and (k < plan.first or corrected)):
            raise IllegalActionError(f"nest {k} touches {x1 if x1 in touched else x2}, which the shared form "
                                     f"writes earlier{' and corrects later' if corrected else ''}")


def _shared_nests(program: Program, plan: _Shared, extra: int) -> list[Nest]:
    """Concatenate the two tensors (their sources, padded once, with `pads`) along `dim`, reduce once over
    the longer output loop, and copy both results out (but what the correction recomputes anyway)."""
    joined = fresh_tensor(program)
    padded = fresh_tensor(program, {joined}) if plan.pads else joined
    result = fresh_tensor(program, {joined, padded})
    dtype = program.tensors[plan.operands[0]].dtype
    if plan.pads:
        pad = plan.pads[0]
        plain, var = pad.target.indices, pad.target.indices[plan.dim].name
        sources = tuple(replace(p.source, indices=plain) for p in plan.pads)
        shape = program.tensors[pad.source.name].shape
        copy_loops = tuple(replace(l, extent=shape[plain.index(Var(l.var))]) for l in pad.nest.loops)
    else:
        copy_loops = _loops_over(program.tensors[plan.operands[0]].shape)
        plain = tuple(Var(l.var) for l in copy_loops)
        sources = tuple(Access(t, dtype, "g", plain) for t in plan.operands)
    seam = tuple(BinOp("+", i, Const(plan.n)) if k == plan.dim else i for k, i in enumerate(plain))
    nests = [Nest(copy_loops, (Equation(Access(joined, dtype, "g", plain), sources[0]),
                               Equation(Access(joined, dtype, "g", seam), sources[1])))]
    if plan.pads:
        widened = loops_with_extent(pad.nest.loops, var, pad.nest.loop(var).extent + plan.n)
        cond = _widen(pad.cond, plan.chain, plan.n)
        nests.append(Nest(widened, (Equation(replace(pad.target, name=padded),
                                             Call("if_then_else", (cond, replace(pad.source, name=joined),
                                                                   pad.fill))),)))
    first = program.nests[plan.first]
    rename = {plan.eq1.lhs.name: result, plan.operands[0]: padded}
    shared = Equation(*(replace_accesses(e, lambda a: replace(a, name=rename.get(a.name, a.name)))
                        for e in (plan.eq1.lhs, plan.eq1.rhs)))
    nests.append(Nest(loops_with_extent(first.loops, plan.out, plan.extent + plan.n), (shared,)))
    copied = plan.copied(extra)
    skip = plan.extent - copied
    second = substitute(plan.eq2.lhs, {plan.out: BinOp("+", Var(plan.out), Const(skip))}) if skip else plan.eq2.lhs
    moved = substitute(plan.eq1.lhs, {plan.out: BinOp("+", Var(plan.out), Const(skip + plan.n))})
    nests.append(Nest(loops_with_extent(plan.outputs, plan.out, copied),
                      (Equation(plan.eq1.lhs, replace(plan.eq1.lhs, name=result)),
                       Equation(second, replace(moved, name=result)))))
    return nests


def _loops_over(shape: tuple[int, ...]) -> tuple[Loop, ...]:
    loops: list[Loop] = []
    for extent in shape:
        loops.append(Loop("L", extent, fresh_loop_var(Nest(tuple(loops), ()))))
    return tuple(loops)


def _corrections(program: Program, plan: _Shared, extra: int) -> list[Nest]:
    """Recompute from the original formula the last outputs of X1 and the first of X2 (in reverse order, as
    the reference writes them) that the shared form got wrong, and `extra` more on each side."""
    first = program.nests[plan.first]
    nests = []
    for eq, count, last in zip((plan.eq1, plan.eq2), plan.recomputed(extra), (True, False)):
        if count > plan.extent:
            raise IllegalActionError(f"extra={extra} recomputes more than the {plan.extent} outputs along {plan.out}")
        if not count:
            continue
        start = plan.extent - count
        index = (BinOp("+", Var(plan.out), Const(start)) if start else Var(plan.out)) if last \
            else BinOp("-", Const(count - 1), Var(plan.out))
        lhs, rhs = _at(eq.lhs, plan.out, index), _at(eq.rhs, plan.out, index)
        init = Const(reduction_identity(plan.op, eq.lhs.dtype))
        init = MINUS_INF if init.value == -math.inf else init
        inner = tuple(l for l in first.loops if l not in plan.outputs)
        nests.append(Nest(loops_with_extent(plan.outputs, plan.out, count),
                          (Equation(lhs, init), Nest(inner, (Equation(lhs, rhs),), trailing=True))))
    return nests


@register
class PartiallyEquivalentThenCorrect(Strategy):
    """Compute a cheaper shared form, then correct the rest: two reductions (nest `nest` and nest `other`) that
    apply the same expression to two same-shaped tensors become one reduction over the two concatenated along
    dimension `dim`, whose results are copied back to both outputs. Where the tensors are identical paddings of
    two sources and read through a sliding window along `dim`, the sources are concatenated and padded once;
    the shared result then equals both outputs except where a window crosses the seam (the last outputs of the
    first, the first of the second), and those are recomputed from the original padded inputs afterwards, plus
    `extra` more on each side. Along a dimension read without a window nothing needs correcting.

    Preconditions: both nests are flat one-equation reductions with the same operator and loops, differing
    only in the tensor they read; every read of it indexes `dim` by one output variable (plus a reduced window
    variable, unit stride) that no other operand reads; the tensors the shared form reads are complete before
    the first nest of the group; each output is first written by its own nest, and the nests in between do not
    touch the second output, nor the first where it is corrected later."""

    name = "partially_equivalent_then_correct"
    params = ("nest", "other", "dim", "extra")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found = []
        for i in range(len(program.nests)):
            for j in range(i + 1, len(program.nests)):
                pair = _quiet(_differing, program, i, j)
                if pair is not None:
                    rank = len(program.tensors[pair[3]].shape)
                    found += [self.action(nest=i, other=j, dim=d, extra=0) for d in range(rank)
                              if _quiet(_shared, program, i, j, d) is not None]
        return found

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        plan = _shared(program, _int(action, "nest"), _int(action, "other"), _int(action, "dim"))
        extra = _int(action, "extra")
        if extra < 0:
            raise IllegalActionError(f"extra must be at least 0, got {extra}")
        nests = program.nests
        middle = tuple(nests[k] for k in range(plan.earliest, plan.second) if k != plan.first)
        return program.replace_nests(nests[:plan.earliest] + tuple(_shared_nests(program, plan, extra)) + middle
                                     + tuple(_corrections(program, plan, extra)) + nests[plan.second + 1:])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Every site with up to window-1 extra outputs recomputed per side (the reference recomputes
        window-1 whatever the padding)."""
        found = []
        for action in self.candidates(before):
            plan = _shared(before, action["nest"], action["other"], action["dim"])
            found += [self.action(**dict(dict(action.params), extra=e)) for e in range(1, plan.window)]
        return found

    def explain(self, before: Program, action: Action, after: Program) -> str:
        plan = _shared(before, action["nest"], action["other"], action["dim"])
        x1, x2 = plan.eq1.lhs.name, plan.eq2.lhs.name
        t1, t2 = plan.operands
        extent, n = plan.extent, plan.n
        what = (f"the sources of the padded copies {t1} and {t2} ({plan.pads[0].source.name} and "
                f"{plan.pads[1].source.name}), concatenated along dimension {plan.dim} and padded once"
                if plan.pads else f"{t1} and {t2} concatenated along dimension {plan.dim}")
        wrong = plan.wrong
        if any(wrong):
            extra = action["extra"]
            seam = (f"That shared form is only partially equivalent: a window of {plan.window} that crosses the "
                    f"seam reads the other tensor instead of padding, which affects the last {wrong[0]} outputs of "
                    f"{x1} and the first {wrong[1]} of {x2}; those"
                    + (f" and {extra} more on each side" if extra else "")
                    + " are recomputed from the original padded inputs afterwards, the correction. ")
        else:
            seam = (f"No output reads across the seam (the reads along dimension {plan.dim} stay inside each "
                    "tensor), so the correction is empty. ")
        return (f"partially_equivalent_then_correct computed {x1} (nest {plan.first}) and {x2} (nest "
                f"{plan.second}), the same {plan.op}-reduction applied to {t1} and to {t2}, as one shared "
                f"reduction over {what}: its {extent + n} outputs along {plan.out} hold {x1} at 0..{extent - 1} "
                f"and {x2} at {n}..{n + extent - 1}, copied back to both. {seam}It is legal because use-def "
                f"shows the two reductions apply the same expression and differ only in {t1} and {t2}, every read "
                f"of them moves with {plan.out} at unit stride, nothing else the reduction reads depends on "
                f"{plan.out}, and what the shared form reads is complete before nest {plan.earliest}, where it now "
                f"runs. Work: {2 * extent} outputs become {extent + n} in one nest instead of two, plus "
                f"{sum(plan.recomputed(action['extra']))} recomputed and a concatenation copy: worth "
                "it where launches or small reductions dominate (GPU), not for memory traffic. Every output "
                "sums the same terms in the same order, so results are bitwise identical.")
