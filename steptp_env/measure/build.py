"""Compile a LEIR program with TVM and run it on NumPy arrays."""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable, Iterator, Mapping

import numpy as np
import tvm

from ..errors import BuildError, StepTPError
from ..ir.ast import accesses, equations
from ..ir.dtypes import is_float
from ..ir.program import Program
from ..lower import lower, target_kind


DIRECT_TIMING_S = 1e-3
"""A kernel whose run takes at least this long is timed by this process's clock around direct calls: TVM's
time_evaluator runs the kernel once, untimed, at every call ("to activate lazy compilation"), which
doubles the runs of a paired timing's rounds; a call's own overhead (microseconds) is under 0.5% of such
a run. Shorter kernels keep TVM's timing in C++, where the untimed run costs under a millisecond."""


def _direct(probe_s: float | None) -> bool:
    """Whether a kernel whose one run took `probe_s` is timed around direct calls."""
    return probe_s is not None and probe_s >= DIRECT_TIMING_S


class RunClock:
    """Seconds this process has spent inside kernel calls (verification runs, timings, TVM's untimed
    warm-ups): what a step's wall time minus this is overhead (`benchmarks/step_latency.py`)."""

    seconds = 0.0

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            cls.seconds += time.perf_counter() - start


@functools.lru_cache(maxsize=None)
def resolve_target(kind: str, opt_level: int | None = None) -> tvm.target.Target:
    """The TVM target for a kind: the host CPU as TVM detects it (never `-mcpu=native`, which TVM 0.27
    turns into generic code), or CUDA with that CPU as host. `opt_level` sets LLVM's optimisation level
    (TVM's default, 3, when None)."""
    host = tvm.target.Target.from_device(tvm.cpu())
    if opt_level is not None:
        host = tvm.target.Target(dict(host.export(), **{"opt-level": opt_level}))
    if kind == "llvm":
        return host
    return tvm.target.Target("cuda", host=host)


class Kernel:
    """A compiled program: call it with a mapping of input arrays, get a dict of output arrays."""

    def __init__(self, program: Program, module: tvm.IRModule | None, executable, kind: str) -> None:
        self.program = program
        self.module = module
        self.executable = executable
        self.kind = kind
        self.device = tvm.cpu() if kind == "llvm" else tvm.cuda()
        self._module = executable  # what runs: the local executable, or a module loaded on an RPC device
        self._session = None
        self._main = None

    @property
    def main(self):
        """The entry function, looked up once (TVM's lookup JIT-links the LLVM module, ~17 ms each time)."""
        if self._main is None:
            self._main = self._module["main"]
        return self._main

    def link(self) -> None:
        """JIT-link an LLVM kernel now (the entry function's first lookup), so that LLVM's machine-code time
        falls where the caller puts it (inside a build) rather than into the first run."""
        if self.kind == "llvm":
            self.main  # noqa: B018  (the lookup is the link)

    @classmethod
    def loaded(cls, program: Program, module) -> Kernel:
        """A kernel of `program` whose code is `module`, a library compiled elsewhere and loaded with
        `tvm.runtime.load_module` (MetaSchedule's, `measure(library=)`): no IRModule, no executable."""
        kernel = cls(program, None, None, "llvm")
        kernel._module = module
        return kernel

    def attach_remote(self, session, module, device) -> None:
        """Run on a device of an RPC session from now on (the module was uploaded and loaded there)."""
        self._session, self._module, self.device = session, module, device
        self._main = None

    def _arguments(self, inputs: Mapping[str, np.ndarray]) -> list:
        args = []
        for spec in self.program.signature.tensors:
            if spec.role == "output":
                args.append(tvm.runtime.empty(spec.shape, spec.dtype, self.device))
                continue
            if spec.name not in inputs:
                raise StepTPError(f"missing input {spec.name!r}")
            array = np.asarray(inputs[spec.name], dtype=spec.dtype, order="C")  # no copy when it fits; 0-d stays 0-d
            if array.shape != spec.shape:
                raise StepTPError(f"input {spec.name!r} has shape {array.shape}, the signature says {spec.shape}")
            args.append(tvm.runtime.tensor(array, self.device))
        return args

    def _execute(self, inputs: Mapping[str, np.ndarray]) -> list:
        args = self._arguments(inputs)
        main = self.main
        with RunClock.running():
            main(*args)
        return args

    def run(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Run once on copies of `inputs`; return (outputs, inputs as the kernel left them)."""
        outs, ins = {}, {}
        for spec, arg in zip(self.program.signature.tensors, self._execute(inputs)):
            (outs if spec.role == "output" else ins)[spec.name] = arg.numpy()
        return outs, ins

    def run_checked(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
        """Run once; (outputs, names of the inputs the kernel changed). Checked here, one input at a time,
        so the inputs as left neither travel back from a worker nor sit in memory together."""
        outs, changed = {}, []
        for spec, arg in zip(self.program.signature.tensors, self._execute(inputs)):
            if spec.role == "output":
                outs[spec.name] = arg.numpy()
            elif not same_array(np.asarray(inputs[spec.name]), arg.numpy()):
                changed.append(spec.name)
        return outs, changed

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs)[0]

    def time(self, inputs: Mapping[str, np.ndarray], number: int = 1, repeat: int = 5,
             warmup: bool = True, probe_s: float | None = None) -> list[float]:
        """Seconds per run, one entry per repeat (TVM's time_evaluator, or direct calls for a kernel whose
        `probe_s` is `DIRECT_TIMING_S` or more), after one untimed warm-up run unless the caller has just
        run the kernel on these inputs itself."""
        args = self._arguments(inputs)
        main = self.main
        with RunClock.running():
            if warmup:
                main(*args)
            if _direct(probe_s):
                return [self._runs(args, number) for _ in range(repeat)]
            return list(self._evaluator(number, repeat)(*args).results)

    def timer(self, inputs: Mapping[str, np.ndarray], number: int, scaled: bool = False,
              probe_s: float | None = None) -> Callable[[], float]:
        """A callable taking one timing (seconds per run, over `number` runs) on arguments made once: for
        callers that interleave the timings of two kernels (`measure.paired`). With `scaled`, each timing is
        scaled by the share of its wall time the process was running (its CPU time over its wall time, at
        most 1): for a one-thread kernel, time the scheduler gave to other processes is taken out, which is
        what makes a timing hold on a busy machine, while on a quiet one it is TVM's own timing (the runs
        timed in C++, no call overhead, which a CPU clock read around the call would add). `probe_s`, one
        run's seconds when known: at `DIRECT_TIMING_S` or more the runs are timed here around direct calls
        (no untimed run per timing)."""
        args = self._arguments(inputs)
        if _direct(probe_s):
            def timed() -> float:
                return self._runs(args, number)
        else:
            evaluator = self._evaluator(number, 1)

            def timed() -> float:
                return evaluator(*args).results[0]

        def timing() -> float:
            wall, cpu = time.perf_counter(), time.process_time()
            with RunClock.running():
                seconds = timed()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            return seconds * min(1.0, cpu / wall) if scaled and wall > 0 else seconds

        return timing

    def _runs(self, args: list, number: int) -> float:
        """Seconds per run of `number` direct calls, read around them (see `DIRECT_TIMING_S`)."""
        main = self.main
        start = time.perf_counter()
        for _ in range(number):
            main(*args)
        return (time.perf_counter() - start) / number

    def _evaluator(self, number: int, repeat: int):
        module = self.executable.mod if self._module is self.executable else self._module
        return module.time_evaluator("main", self.device, number=number, repeat=repeat, min_repeat_ms=0)

    @property
    def source(self) -> str:
        """Generated device source: CUDA C for `cuda`, LLVM IR for `llvm`."""
        mod = self.executable.mod
        if self.kind == "cuda":
            return mod.imports[0].inspect_source()
        return mod.inspect_source("ll")


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and elements, NaN equal to NaN for floats."""
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=is_float(str(a.dtype))))


def _pass_config(program: Program) -> dict:
    """TVM's StorageRewrite lets a never-read intermediate share memory with one that is live while both
    are written (tests/test_strategies_graph.py::test_dead_write_beside_a_live_one): for programs with
    such a dead store, buffer sharing is turned off rather than the store dropped (it is work the program
    asks for, and its cost belongs to the measurement)."""
    read = {acc.name for nest in program.nests for _, eq in equations(nest)
            for acc in (*accesses(eq.rhs), *(a for i in eq.lhs.indices for a in accesses(i))) if acc.name != eq.lhs.name}
    dead = [name for name in program.intermediates if name not in read]
    return {"tirx.disable_storage_rewrite": True} if dead else {}


def build(program: Program, target: str = "llvm", opt_level: int | None = None) -> Kernel:
    """Lower and compile; `BuildError` when TVM cannot compile the lowered module. A `cuda` kernel can be
    built (and its source read) on a machine without a GPU; running it needs one. `opt_level` (LLVM's,
    default 3) is for checks that only need the program's semantics: level 0 builds 2-3x faster."""
    kind = target_kind(target)
    module = lower(program, kind)
    try:
        with tvm.transform.PassContext(config=_pass_config(program)):
            executable = tvm.compile(module, target=resolve_target(kind, opt_level))
    except Exception as exc:  # TVM raises many error types from its passes and code generators
        raise BuildError(f"TVM could not compile the program for {kind}: {str(exc).strip()[-2000:]}") from exc
    return Kernel(program, module, executable, kind)
