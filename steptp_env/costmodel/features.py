"""Program features: the rows the cost model sums over, and a fixed-length vector for observations.

The cost model sees a program as a set of rows, as MetaSchedule's XGBoost model does: one per buffer store
of the lowered module (TVM's 164 `PerStoreFeature` numbers) and one per LEIR equation
(`loop_features.equation_row`: loops, strides, footprints), each tagged with its kind; the other part of
a row is missing (NaN, which XGBoost routes on its own). Observations for RL policies keep a fixed length:
the store rows pooled (mean, max, sum) plus program-level LEIR numbers (`Features.observation`).
"""
from __future__ import annotations

import base64
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.analysis import loop_iterations, reduction, reduction_length
from ..ir.ast import BinOp, Call, Var, accesses, all_loops, equations, walk
from ..ir.program import Program, tensor_bytes
from ..measure.metaschedule import meta_schedule
from .loop_features import ROW_SIZE as EQUATION_SIZE
from .loop_features import equation_rows

FEATURE_VERSION = 2
PER_STORE = 164
POOLS = ("mean", "max", "sum")
LEIR_FEATURES = ("nests", "equations", "log_iterations", "log_max_nest_iterations", "reductions",
                 "log_reduction_length", "log_bytes_touched", "log_flops", "arithmetic_intensity", "loops_L",
                 "loops_P", "loops_V", "loops_U", "loops_B", "innermost_vectorizable", "log_intermediate_bytes",
                 "transcendental_ops", "max_depth")
SIZE = PER_STORE * len(POOLS) + len(LEIR_FEATURES)
"""Length of the observation vector."""
ROW_WIDTH = 1 + PER_STORE + EQUATION_SIZE
"""Length of a cost-model row: kind (0 a TIR store, 1 a LEIR equation), the TIR part, the LEIR part."""


_EXTRACTOR = None


def store_rows(program: Program, target: str = "llvm") -> np.ndarray:
    """`PerStoreFeature` rows (stores x 164) of the lowered module. The module is lowered in TVM's form
    (`T.init()` reductions, TVM's math intrinsics), which the extractor understands; the compiled form
    (reductions initialised before their loops, exp/log/erf as arithmetic) maps one to one onto it, so
    the rows tell programs apart as well, and runtimes of the compiled form are what the model learns."""
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
    rows = rows.numpy().astype(np.float32)
    return rows if rows.size else np.zeros((0, PER_STORE), np.float32)


def tir_features(program: Program, target: str = "llvm") -> np.ndarray:
    """The store rows pooled (mean, max, sum) to 3 x 164 numbers."""
    return _pooled(store_rows(program, target))


def _pooled(rows: np.ndarray) -> np.ndarray:
    rows = rows if rows.size else np.zeros((1, PER_STORE), np.float32)
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


@dataclass(frozen=True)
class Features:
    """A program's cost-model rows and its observation vector, computed together (one lowering)."""

    rows: np.ndarray  # (stores + equations, ROW_WIDTH)
    observation: np.ndarray  # (SIZE,)

    def to_json(self) -> dict[str, Any]:
        """A compact form for the result store: the rows as zlib-compressed float32 bytes in base64."""
        packed = base64.b64encode(zlib.compress(np.ascontiguousarray(self.rows, np.float32).tobytes(), 6))
        return {"version": FEATURE_VERSION, "rows": packed.decode(), "row_count": int(len(self.rows)),
                "observation": self.observation.tolist()}

    @classmethod
    def from_json(cls, data: Any) -> Features | None:
        """Features stored by `to_json`; None for another feature version (older records keep a flat
        list), which the caller recomputes."""
        if not isinstance(data, dict) or data.get("version") != FEATURE_VERSION:
            return None
        flat = np.frombuffer(zlib.decompress(base64.b64decode(data["rows"])), np.float32)
        rows = flat.reshape(data["row_count"], ROW_WIDTH).copy()
        return cls(rows, np.asarray(data["observation"], np.float32))


def model_rows(stores: np.ndarray, equations: np.ndarray) -> np.ndarray:
    """Store rows and equation rows in one table of ROW_WIDTH columns, each with the other part missing."""
    table = np.full((len(stores) + len(equations), ROW_WIDTH), np.nan, np.float32)
    table[:len(stores), 0] = 0.0
    table[:len(stores), 1:1 + PER_STORE] = stores
    table[len(stores):, 0] = 1.0
    table[len(stores):, 1 + PER_STORE:] = equations
    return table


def features(program: Program, target: str = "llvm") -> Features:
    """The cost model's rows and the observation vector of a program."""
    stores = store_rows(program, target)
    observation = np.concatenate([_pooled(stores), leir_features(program)])
    return Features(model_rows(stores, equation_rows(program)), observation)
