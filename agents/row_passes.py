"""Row-pass chains: a prior over the shape of a fast row-wise operator (softmax, the norms, attention's
score rows), written as actions of the menu and played whole.

Such an operator is a run of nests over the same rows: a maximum, a sum of exponentials, a scaled output.
Fast code for it (PyTorch's vectorised softmax, a fused kernel) computes each transcendental once, keeps
vector-wide partial results for the reductions, runs the elementwise passes on full vectors and works one
row at a time, so a row is still in cache when the next pass reads it. The menu reaches that in four
moves, each applied wherever it fits:

1. `common_subexpression_elimination` where the repeated expression holds a transcendental call (softmax's
   exp(x - max), once in the sum and once in the output);
2. `reduction_factorization(..., lanes=16)` on each reduction along a contiguous axis;
3. `loop_split(..., factor=16)` then `loop_vectorization` on each elementwise nest whose innermost loop
   walks the stored row;
4. the depth form of `operator_fusion` under the shared row loops, first pair first, until none is left.

Each step alone often measures slower or no faster (a stored exp(x - max) costs a pass of memory until the
row fusion brings it back into cache), which is why a search paid step by step does not find the end and
the focus agent plays the chain whole. Contractions are left alone: they get register tiles (`tiles`), and
fused under a row loop they could not.
"""
from __future__ import annotations

from collections.abc import Callable

from steptp_env.ir.analysis import reduction
from steptp_env.ir.ast import Call, Equation, free_vars, walk
from steptp_env.ir.program import Program
from steptp_env.strategies import REGISTRY, Action
from steptp_env.strategies.loop_deps import affine

from .tiles import is_contraction

LANES = 16
MAX_ACTIONS = 48
"""A bound on one chain's length (each step function below makes progress, so it is never reached on
the suite; it guards against a menu change that would let a step repeat)."""


def row_pass_chain(program: Program) -> list[str]:
    """The chain for `program` (see the module docstring): action texts, each on the menu of the program
    the ones before it make, applied in order; empty when no step fits."""
    chain: list[str] = []
    for step in (_shared_transcendental, _lane_reduction, _vector_pass, _row_fusion):
        while len(chain) < MAX_ACTIONS and (action := step(program)) is not None:
            program = REGISTRY[action.strategy].apply(program, action)
            chain.append(action.text)
    return chain


def _first(program: Program, strategy: str, keep: Callable[[Action], bool]) -> Action | None:
    return next((a for a in REGISTRY[strategy].candidates(program) if keep(a)), None)


def _plain(program: Program, n: int) -> Equation | None:
    """The equation of nest n when the nest is flat, holds one equation, has no vector loop yet and is not
    a contraction (contractions are the register tiles' work)."""
    nest = program.nests[n]
    if len(nest.body) != 1 or not isinstance(nest.body[0], Equation) or any(l.kind == "V" for l in nest.loops) \
            or is_contraction(program, n):
        return None
    return nest.body[0]


def _shared_transcendental(program: Program) -> Action | None:
    """A one-site common subexpression elimination whose stored value holds a call."""
    def holds_call(action: Action) -> bool:
        (n,) = action["nests"] if len(action["nests"]) == 1 else (None,)
        if n is None or _plain(program, n) is None:
            return False
        made = REGISTRY[action.strategy].apply(program, action).nests[n]
        return any(isinstance(node, Call) for eq in made.body if isinstance(eq, Equation) for node in walk(eq.rhs))

    return _first(program, "common_subexpression_elimination", holds_call)


def _lane_reduction(program: Program) -> Action | None:
    """Lane-wise partial results for a reduction of a plain nest (the partials get a vector loop, the
    combine is shorter than the lanes, so neither is offered again)."""
    return _first(program, "reduction_factorization",
                  lambda a: a.get("lanes") == LANES and _plain(program, a["nest"]) is not None)


def _vector_pass(program: Program) -> Action | None:
    """For a plain elementwise nest whose innermost loop walks the stored row: split that loop into
    vectors, then vectorise the inner part."""
    for n in range(len(program.nests)):
        eq = _plain(program, n)
        inner = program.nests[n].loops[-1] if eq is not None and program.nests[n].loops else None  # a scalar
        if inner is None or reduction(program.nests[n].loops, eq) is not None or inner.extent % LANES \
                or not _walks_row(eq, inner.var):
            continue
        if inner.extent == LANES:
            want = Action.parse(f"loop_vectorization(nest={n}, loop={inner.var})")
        else:
            want = Action.parse(f"loop_split(nest={n}, loop={inner.var}, factor={LANES})")
        if want in REGISTRY[want.strategy].candidates(program):
            return want
    return None


def _walks_row(eq: Equation, var: str) -> bool:
    """The stored element moves by one as `var` does, and `var` appears in no other subscript."""
    *outer, last = eq.lhs.indices or (None,)
    form = affine(last) if last is not None else None
    return form is not None and form[0].get(var) == 1 and not any(var in free_vars(i) for i in outer)


def _row_fusion(program: Program) -> Action | None:
    """The first depth fusion of two nests that are not contractions."""
    return _first(program, "operator_fusion",
                  lambda a: a.get("depth") is not None and not is_contraction(program, a["nest"])
                  and not is_contraction(program, a["nest"] + 1))
