"""TVM's MetaSchedule on these machines: loading it cheaply, and tuning a program's lowered TIR as a baseline.

Importing `tvm.s_tir.tensor_intrin` registers every CUDA/ROCm/ARM/x86 tensor intrinsic, which takes tens of
seconds; MetaSchedule imports it, and so does each of its builder workers, whose 30 s default timeout then
kills every build (../shared/notes/platform-tvm.md). `meta_schedule()` loads MetaSchedule with an empty
package in that module's place; `x86_intrinsics_only` is the builder workers' initializer (the x86 ones are
the only ones a CPU schedule can use).
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..ir.program import Program
from .build import Kernel, resolve_target


def meta_schedule():
    """`tvm.s_tir.meta_schedule`, imported without registering the tensor intrinsics of every target."""
    if "tvm.s_tir.tensor_intrin" not in sys.modules:
        spec = importlib.util.find_spec("tvm.s_tir.tensor_intrin")
        stub = types.ModuleType("tvm.s_tir.tensor_intrin")
        stub.__path__ = list(spec.submodule_search_locations) if spec else []
        sys.modules["tvm.s_tir.tensor_intrin"] = stub
    from tvm.s_tir import meta_schedule as ms

    return ms


def x86_intrinsics_only() -> None:
    """Builder-worker initializer: the package stub, then only the x86 intrinsics."""
    meta_schedule()
    importlib.import_module("tvm.s_tir.tensor_intrin.x86")


@dataclass
class TunedKernel:
    """MetaSchedule's best schedule for a program, built: `kernel` runs and times like any `build` result."""

    kernel: Kernel
    trials: int
    tuning_s: float


def tune(program: Program, trials: int = 64, threads: int = 1, work_dir: str | Path | None = None,
         seed: int = 0) -> TunedKernel:
    """Tune the program's lowered start TIR with MetaSchedule (`tune_tir`, `trials` measured candidates,
    XGBoost cost model, evolutionary search) for the host CPU with `threads` cores, and build the best
    schedule. The TIR is lowered in TVM's form (`lower(..., tvm_form=True)`: `T.init()` reductions, which
    MetaSchedule's rules decompose themselves, and TVM's math intrinsics, which its analyses accept). Runs
    builds in worker processes; the kernels are timed in LocalRunner workers with the thread count of this process's TVM runtime (`TVM_NUM_THREADS`)."""
    from ..lower import lower

    ms = meta_schedule()
    x86_intrinsics_only()
    target = tvm.target.Target(dict(resolve_target("llvm").export(), **{"num-cores": threads}))
    module = lower(program, "llvm", tvm_form=True)
    builder = ms.builder.LocalBuilder(timeout_sec=120, initializer=x86_intrinsics_only)
    runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=ms.runner.EvaluatorConfig(
        number=3, repeat=1, min_repeat_ms=20))
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() if work_dir is None else contextlib.nullcontext(str(work_dir)) as folder:
        database = ms.tune_tir(module, target, str(folder), max_trials_global=trials,
                               num_trials_per_iter=min(trials, 16), builder=builder, runner=runner, seed=seed,
                               num_tuning_cores=threads)
        schedule = ms.tir_integration.compile_tir(database, module, target)
    tuning_s = time.perf_counter() - start
    tuned = module if schedule is None else schedule.mod  # None: no candidate built and ran
    executable = tvm.compile(tuned, target=target)
    return TunedKernel(Kernel(program, tuned, executable, "llvm"), trials, tuning_s)



def tune_library(program: Program, path: str | Path, trials: int = 64, threads: int = 1, seed: int = 0) -> dict:
    """`tune` in a fresh process that exports the best schedule's kernel to `path` (a shared library for
    `measure(..., library=path)`), so that nothing of the tuning (MetaSchedule's threads, TVM's thread pool,
    whose workers are bound to cores) is left in the caller, which may time PyTorch next: after an
    in-process tuning and timing at two threads, PyTorch's calls on the 2-core machine intermittently took
    8 ms instead of 0.2 (level1/matmul_batched, level1/softmax), for seconds. The child inherits
    `TVM_NUM_THREADS`. Returns tuning seconds and trials; raises what the tuning raised (as RuntimeError)."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_tune_and_export, program.leir, program.signature.to_json(), str(path), trials, threads,
                           seed).result()


def _tune_and_export(leir: str, signature: list, path: str, trials: int, threads: int, seed: int) -> dict:
    try:
        tuned = tune(Program.parse(leir, signature), trials=trials, threads=threads, seed=seed)
        tuned.kernel.executable.export_library(path)
    except Exception as exc:  # TVM's errors do not all pickle: the message crosses the process boundary
        raise RuntimeError(f"{type(exc).__name__}: {' '.join(str(exc).split())[-2000:]}") from None
    return {"tuning_s": tuned.tuning_s, "trials": tuned.trials}
