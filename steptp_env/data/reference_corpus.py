"""Reading the Step-TP reference corpus and explaining where its transformations are wrong.

The corpus (../shared/steptp-ref) is format ground truth, not semantic ground truth: some of its
transformed programs compute something else than their originals. `explain_mismatch` names the known
reference bug behind a non-equivalent pair, and proves it by repairing the bug (or restricting the inputs
to the rewrite's domain) and verifying again.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..ir.analysis import accumulation, reduction
from ..ir.ast import Nest, accesses, equations, free_vars
from ..ir.program import Program

DEFAULT_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "steptp-ref"


def load_programs(root: Path = DEFAULT_ROOT) -> dict[str, dict]:
    """Program id -> row of programs.jsonl."""
    with open(root / "programs.jsonl") as f:
        return {row["id"]: row for row in map(json.loads, f)}


def load_transitions(root: Path = DEFAULT_ROOT) -> Iterator[dict]:
    """Rows of transitions.jsonl.gz, in file order, each with its number as `row`."""
    with gzip.open(root / "transitions.jsonl.gz", "rt") as f:
        for number, line in enumerate(f):
            yield dict(json.loads(line), row=number)


def drop_stale_combine_loops(program: Program) -> Program | None:
    """Repair of a reference bug in reduction_factorization and tensor_split_to_decouple_operators: the
    nest that adds the partial results (`C=C+(E+F)`) keeps loops of the original reduction that neither
    C nor the partial results are indexed by, so the partial sums are added once per iteration of those
    loops. Returns the program without such loops, or None where no nest has them."""
    nests, changed = [], False
    partials: set[str] = set()  # tensors earlier nests computed as reductions
    for nest in program.nests:
        eqs = list(equations(nest))
        stale: set[str] = set()
        if len(eqs) == 1 and not any(isinstance(s, Nest) for s in nest.body):
            loops, eq = eqs[0]
            red, acc = reduction(loops, eq), accumulation(eq)
            reads = list(accesses(acc[1])) if acc else []
            if red is not None and reads and all(a.name in partials for a in reads):
                used = {v for a in reads for i in a.indices for v in free_vars(i)}
                stale = {v for v in red.reduced_vars if v not in used}
        partials.update(eq.lhs.name for loops, eq in eqs if reduction(loops, eq) is not None)
        if stale:
            nest = replace(nest, loops=tuple(l for l in nest.loops if l.var not in stale))
            changed = True
        nests.append(nest)
    return program.replace_nests(nests) if changed else None


@dataclass
class _PositiveInputs:
    """A verify reference that runs `program` on inputs drawn from (0.01, 1]: the domain of log."""

    program: Program

    def __post_init__(self) -> None:
        from ..measure import build

        self.kernel = build(self.program)

    def make_inputs(self, seed: int) -> dict[str, np.ndarray]:
        from ..measure import random_inputs

        return {k: (np.abs(v) + 0.01 if np.issubdtype(v.dtype, np.floating) else v).astype(v.dtype)
                for k, v in random_inputs(self.program, seed).items()}

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.kernel(inputs)


def explain_mismatch(original: Program, transformed: Program) -> str | None:
    """The known reference bug that makes `transformed` differ from `original`, proven by a repair that
    verifies; None when no known bug explains the pair."""
    from ..measure import verify

    repaired = drop_stale_combine_loops(transformed)
    if repaired is not None and verify(repaired, original).equivalent:
        return ("stale reduction loop: the nest combining the partial results keeps a loop of the original "
                "reduction and adds them once per iteration; equivalent once that loop is dropped")
    if verify(transformed, _PositiveInputs(original)).equivalent:
        return ("domain: the rewrite holds only for positive inputs (like log(a)+log(b) = log(a*b)); "
                "equivalent on inputs in (0.01, 1], not on [-1, 1)")
    return None
