"""Program features for the cost model: TVM's per-store features on the lowered module, pooled to a fixed
length, plus LEIR-level features the TIR view does not show directly (loop kinds, trip counts, bytes,
arithmetic intensity, vectorizable innermost extents)."""
from __future__ import annotations

import math

import numpy as np

from ..ir.analysis import loop_iterations, reduction, reduction_length
from ..ir.ast import BinOp, Call, Var, accesses, all_loops, equations, walk
from ..ir.program import Program, tensor_bytes
from ..measure.metaschedule import meta_schedule

FEATURE_VERSION = 1
PER_STORE = 164
POOLS = ("mean", "max", "sum")
LEIR_FEATURES = ("nests", "equations", "log_iterations", "log_max_nest_iterations", "reductions",
                 "log_reduction_length", "log_bytes_touched", "log_flops", "arithmetic_intensity", "loops_L",
                 "loops_P", "loops_V", "loops_U", "loops_B", "innermost_vectorizable", "log_intermediate_bytes",
                 "transcendental_ops", "max_depth")
SIZE = PER_STORE * len(POOLS) + len(LEIR_FEATURES)


_EXTRACTOR = None


def tir_features(program: Program, target: str = "llvm") -> np.ndarray:
    """`PerStoreFeature` rows of the lowered module, pooled (mean, max, sum) to 3 x 164 numbers. The module is
    lowered in TVM's form (`T.init()` reductions, TVM's math intrinsics), the form the packaged model's
    training programs had (FEATURE_VERSION 1). Every program now runs with its reductions initialised
    before their loops and float32 exp/log/erf as arithmetic (LOWERING_VERSION 2); the two forms map one to
    one, so the features still tell programs apart as before, and a model retrained on runtimes of the new
    lowering learns what the changes are worth."""
    global _EXTRACTOR
    ms = meta_schedule()
    from tvm.s_tir import Schedule

    from ..lower import lower
    from ..measure.build import resolve_target

    if _EXTRACTOR is None:
        _EXTRACTOR = ms.feature_extractor.PerStoreFeature()
    module = lower(program, target, tvm_form=True)
    candidate = ms.MeasureCandidate(Schedule(module), ms.arg_info.ArgInfo.from_prim_func(module["main"]))
    rows = _EXTRACTOR.extract_from(ms.TuneContext(mod=module, target=resolve_target(target)), [candidate])[0]
    rows = rows.numpy()
    if rows.size == 0:
        rows = np.zeros((1, PER_STORE))
    return np.concatenate([rows.mean(0), rows.max(0), rows.sum(0)]).astype(np.float32)


def leir_features(program: Program) -> np.ndarray:
    """Features read off the LEIR program itself."""
    tensors = program.tensors
    nest_iters, flops, transcendental, kinds = [], 0, 0, {k: 0 for k in "LPVUB"}
    innermost_ok = innermost = reductions = depth = 0
    touched = set()
    for nest in program.nests:
        for loop in all_loops(nest):
            kinds[loop.kind] += 1
        nest_iters.append(loop_iterations((nest,)))
        for loops, eq in equations(nest):
            trips = math.prod(l.extent for l in loops)
            ops = sum(isinstance(n, (BinOp, Call)) for n in walk(eq.rhs))
            flops += trips * max(1, ops)
            transcendental += sum(isinstance(n, Call) and n.func in ("exp", "log", "sqrt", "erf") for n in walk(eq.rhs))
            reductions += reduction(loops, eq) is not None
            depth = max(depth, len(loops))
            touched.update(a.name for a in (eq.lhs, *accesses(eq.rhs)))
            if loops:
                innermost += 1
                last = loops[-1]
                unit = eq.lhs.indices and eq.lhs.indices[-1] == Var(last.var)
                innermost_ok += bool(unit and last.extent % 4 == 0)
    bytes_touched = sum(tensor_bytes(tensors[n]) for n in touched if n in tensors)
    inter = sum(tensor_bytes(t) for t in tensors.values() if t.role == "intermediate")
    total = sum(nest_iters)
    values = [len(program.nests), sum(1 for n in program.nests for _ in equations(n)), math.log1p(total),
              math.log1p(max(nest_iters, default=0)), reductions, math.log1p(reduction_length(program.nests)),
              math.log1p(bytes_touched), math.log1p(flops), flops / max(1, bytes_touched), kinds["L"], kinds["P"],
              kinds["V"], kinds["U"], kinds["B"], innermost_ok / max(1, innermost), math.log1p(inter),
              transcendental, depth]
    return np.asarray(values, dtype=np.float32)


def features(program: Program, target: str = "llvm") -> np.ndarray:
    """The cost model's input vector (length `SIZE`)."""
    return np.concatenate([tir_features(program, target), leir_features(program)])
