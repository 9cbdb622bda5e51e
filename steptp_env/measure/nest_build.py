"""Checking builds nest by nest, reusing what earlier checks compiled.

A verification build needs the program's semantics, not its speed, and the programs checked one after the
other (a workload's candidate steps, a walk's programs) share most of their nests: a one-step row changes
1.6 of 10.4 nests on average over the suite at `small`, and LLVM's code generation and JIT link were most
of a check's CPU time. So a checked program is lowered one function per nest (`lower.lower_by_nest`), the
functions are looked up by structure in this process's table of compiled ones, and only the new ones are
compiled, in one module (one code generation, one link). The kernel runs its functions in order on shared
arrays. Timed kernels are always built whole (`build.build`): LLVM sees there what the program is.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import tvm
import tvm_ffi

from ..errors import BuildError, StepTPError
from ..ir.program import Program
from ..lower import lower_by_nest
from .build import Kernel, RunClock, _pass_config, resolve_target

COMPILED_KEPT = 4096
"""Compiled nest functions this process keeps (least recently used dropped first); a function holds its
module's code alive, a few kilobytes each."""

_COMPILED: "OrderedDict[tuple, tuple[Any, Any]]" = OrderedDict()  # (structure, level, config) -> (function, module)


class NestKernel(Kernel):
    """A program built nest by nest (`build_by_nest`): called like a `Kernel`, for checks only (never timed:
    its code is not what `build` makes of the whole program)."""

    def __init__(self, program: Program, calls: list[tuple[Any, tuple[str, ...]]], modules: list) -> None:
        super().__init__(program, None, None, "llvm")
        self.calls, self.modules = calls, modules  # the modules hold the functions' code
        self.shared = sorted({name for _, params in calls for name in params if name not in program.signature})

    @property
    def main(self):
        raise StepTPError("a kernel built nest by nest is for checks; time the program built whole (`build`)")

    def link(self) -> None:
        """Nothing to do: `build_by_nest` looked its functions up, which linked them."""

    def _execute(self, inputs: Mapping[str, np.ndarray]) -> list:
        args = self._arguments(inputs)
        arrays = dict(zip((spec.name for spec in self.program.signature.tensors), args))
        tensors = self.program.tensors
        for name in self.shared:  # intermediates of several nests: fresh, uninitialised, as `main` allocates them
            arrays[name] = tvm.runtime.empty(tensors[name].shape, tensors[name].dtype, self.device)
        with RunClock.running():
            for function, params in self.calls:
                function(*(arrays[name] for name in params))
        return args


def build_by_nest(program: Program, opt_level: int | None = None) -> NestKernel:
    """A CPU kernel of `program` for checks: its nests' functions, compiled (LLVM level `opt_level`, 3 when
    None) only where no function of the same structure was compiled before in this process. `BuildError` when
    TVM cannot compile one."""
    parts = lower_by_nest(program)
    config = _pass_config(program)
    keys = [(tvm_ffi.StructuralKey(func), opt_level, tuple(sorted(config))) for func, _ in parts]
    missing: dict[tuple, Any] = {}
    for key, (func, _) in zip(keys, parts):
        if key not in _COMPILED:
            missing.setdefault(key, func)
    if missing:
        symbols = [f"nest{i}" for i in range(len(missing))]
        module = tvm.IRModule({s: f.with_attr("global_symbol", s) for s, f in zip(symbols, missing.values())})
        try:
            with tvm.transform.PassContext(config=config):
                executable = tvm.compile(module, target=resolve_target("llvm", opt_level))
            functions = [executable[s] for s in symbols]  # the first lookup JIT-links the module
        except Exception as exc:  # TVM raises many error types from its passes and code generators
            raise BuildError(f"TVM could not compile the program for llvm: {str(exc).strip()[-2000:]}") from exc
        for key, function in zip(missing, functions):
            _COMPILED[key] = (function, executable)
    calls, modules = [], []
    for key, (_, params) in zip(keys, parts):
        _COMPILED.move_to_end(key)
        function, module = _COMPILED[key]
        calls.append((function, params))
        modules.append(module)
    while len(_COMPILED) > COMPILED_KEPT:
        _COMPILED.popitem(last=False)
    return NestKernel(program, calls, modules)
