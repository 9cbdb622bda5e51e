"""Online-algorithm strategies: prefix (scan) forms of reductions, online softmax, and flash attention without
tiling.

Sites come from the analysis, never from the text: a max reduction is `reduction(...).op == "max"` over one
loop, a softmax chain is a sum-of-exp reduction whose exponent subtracts a tensor that use-def traces to a max
reduction of the same values, attention is that chain followed by the normalisation and the one reduction that
reads the probabilities. Numerics are not bitwise: every rewrite here reassociates or rescales floating-point
work, the explanations say so, and candidates are offered only where `ValueFacts` proves the rewrite cannot
create NaN or a division by zero (the reference's online recurrences on rows whose first score is -inf are
not offered).

Result shapes follow the Step-TP reference (scan tensors that keep one element per step, guarded
predecessors `if_then_else(a-1<0,-inf,X_{...,a-1})`, a copy nest that reads the last step) so that `identify`
recognises its rows. online_softmax and flashattention_wo_tiling also offer `state=inplace`, one running value
per row updated in place: the same recurrences without the per-step storage, which is what makes them pay.
The value splits are in `value_splits.py`, partially_equivalent_then_correct in `shared_then_correct.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import reads, reduction, writes
from ..ir.ast import Access, BinOp, Call, Const, Equation, Expr, Loop, Nest, Statement, Var, accesses, replace_accesses
from ..ir.dtypes import is_float
from ..ir.printer import print_expr
from ..ir.program import Program
from .base import Action, Strategy, register
from .graph_util import bounds_of, describe_loops, substitute, trip_count
from .online_util import (FINITE, MINUS_INF, POS_INF, ValueFacts, extended, finite_guard, lagged, positional_renaming,
                          rename_vars, scan_dim, single_equation)
from .util import flag_param, fresh_loop_var, fresh_tensor, int_param, is_intermediate, nest_at, quiet, writer_nests



def _pinned(expr: Expr, loops: tuple[Loop, ...]) -> Expr:
    """`expr` with the variables of one-iteration loops replaced by 0, so `H_{a,c}` inside `L^{1}_{c=0}`
    compares equal to `H_{a,0}`."""
    return substitute(expr, {l.var: Const(0) for l in loops if l.extent == 1})


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
    writers = writer_nests(program, m_name)
    if len(writers) != 1 or writers[0] >= index or not is_intermediate(program, m_name):
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
        return [self.action(nest=i) for i in range(len(program.nests)) if quiet(_max_site, program, i)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        site = _max_site(program, int_param(action, "nest"))
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
            site = quiet(self.site, program, i)
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
        chain = _chain(program, int_param(action, "nest"))
        site = chain.site
        fused, m, s = _fused_pass(chain, fresh_tensor(program), flag_param(action, "guard"))
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
        if not is_intermediate(program, chain.s.name) or writer_nests(program, chain.s.name) != [chain.index]:
            raise IllegalActionError(f"{chain.s.name} is a signature tensor or written elsewhere; its reads "
                                     "cannot be redirected to the running sum")
        return chain

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        chain = self.site(program, int_param(action, "nest"))
        site = chain.site
        guard, state = flag_param(action, "guard"), _state(action)
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
    if not is_intermediate(program, p.name) or writer_nests(program, p.name) != [n]:
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
    if not is_intermediate(program, s_name) or writer_nests(program, s_name) != [chain.index]:
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
        att = _attention(program, int_param(action, "nest"))
        guard, state = flag_param(action, "guard"), _state(action)
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
