"""How good a search's result is: its start program, its best program and PyTorch eager, timed side by side.

The runtimes a search saw were measured minutes apart, under whatever load the machine had then, or only
predicted (model mode), so a ratio between two of them says as much about the load as about the programs.
`compare` times the three in turn, a few rounds in one process under the env's measurement protocol (its
thread count included), and keeps the medians. PyTorch is called directly, `module(*tensors)` under
`torch.inference_mode()`: through `Workload.reference` (NumPy copies, `functional_call`) it is 1.2-1.8x
slower, which would flatter every program compared with it.

PyTorch allocates every output (and intermediate) on each call, and glibc's malloc hands large blocks back
to the kernel (an `munmap`, or a trim of the heap's top) depending on what the process allocated before: on
the 2-vCPU AMD VM the same eager call of level2/conv2d_relu_hardswish took 1.8 ms in one process and 0.29 ms
in another, the difference being page faults on fresh output pages. `torch_seconds` therefore times PyTorch
at its allocator's steady state (`steady_allocator`: no trimming, large blocks from the heap), the faster of
the two and what a long-running PyTorch process settles into; the kernels it is compared with write into
preallocated buffers.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import math
import statistics
import time
from typing import Callable

import torch

from steptp_env.env import StepTPEnv
from steptp_env.errors import StepTPError
from steptp_env.frontend.workload import Workload
from steptp_env.ir import Program
from steptp_env.measure import Protocol, measure
from steptp_env.measure.runner import settle_workers, timing_lock
from steptp_env.measure.worker import pinned, runs_per_timing

from .common import AgentResult

ROUNDS = 3

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
"""glibc's mallopt parameter numbers (malloc.h)."""


@functools.cache
def steady_allocator() -> bool:
    """Make this process's glibc malloc keep freed memory (no heap trimming, 64 MiB of top padding, blocks up
    to 32 MiB from the heap rather than fresh mappings), so that a PyTorch call does not page-fault on its
    outputs; once per process. False where the C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in
               ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20)))


def torch_seconds(workload: Workload, protocol: Protocol, module: Callable | None = None) -> float:
    """Seconds per direct call of the workload's module (or of `module`, e.g. its `torch.compile`d form) on
    the workload's seeded inputs (`protocol.seed`): one warm-up call, timed to size the blocks as the
    kernels' timings are sized, then the median of `protocol.repeat` blocks, on `protocol.threads` threads
    (the caller's count is restored); at more than one thread, once the measurement workers are idle
    (`settle_workers`), with the allocator at its steady state (`steady_allocator`). Raises StepTPError when
    the workload has no module."""
    if workload.module is None:
        raise StepTPError("the workload has no PyTorch module")
    steady_allocator()
    module = workload.module if module is None else module
    args = workload.torch_arguments(workload.make_inputs(protocol.seed))
    threads = torch.get_num_threads()
    torch.set_num_threads(protocol.threads)
    if protocol.threads > 1:  # a worker's thread pool still spinning would share PyTorch's cores
        settle_workers()
    try:
        with torch.inference_mode(), timing_lock(), pinned(protocol.threads):
            probe = _per_call(module, args, 1)
            number = runs_per_timing(probe, protocol.number, protocol.min_seconds)
            return statistics.median(_per_call(module, args, number) for _ in range(protocol.repeat))
    finally:
        torch.set_num_threads(threads)


def _per_call(module: Callable, args: tuple[torch.Tensor, ...], number: int) -> float:
    """Seconds per call over one block of `number` calls in a row."""
    start = time.perf_counter()
    for _ in range(number):
        module(*args)
    return (time.perf_counter() - start) / number


def kernel_seconds(program: Program, workload: Workload, target: str, protocol: Protocol,
                   library: str | None = None) -> float:
    """The median runtime of one `measure` (build, or load `library`, then verify and time in the worker);
    StepTPError when the program fails to build, run or verify."""
    m = measure(program, workload, target, protocol, library=library)
    if not m.ok:
        raise StepTPError(m.error)
    return m.median_s


def compare(env: StepTPEnv, result: AgentResult, rounds: int = ROUNDS) -> AgentResult:
    """`result` with its side-by-side fields filled: the start program of the env's workload (the one the
    search ran on), the best program and PyTorch eager, each timed once per round in turn under the env's
    target and protocol. A figure that cannot be taken stays None and `compared_note` says why; a search's
    result is never lost to it."""
    env = env.unwrapped
    workload, protocol = env.workload, env.oracle.protocol
    if workload is None or workload.uri != result.workload:
        raise ValueError(f"the env is on {getattr(workload, 'uri', None)!r}, the result is for {result.workload!r}")
    if workload.module is None:  # `measure` verifies against the module: without one nothing is timed
        return dataclasses.replace(result, compared_threads=protocol.threads,
                                   compared_note="the workload has no PyTorch module to verify against and time")
    start = workload.program
    best = Program.parse(result.best_leir, start.signature)
    timers: dict[str, Callable[[], float]] = {
        "start program": lambda: kernel_seconds(start, workload, env.target, protocol),
        "best program": lambda: kernel_seconds(best, workload, env.target, protocol)}
    notes = []
    if env.target == "llvm":
        timers["PyTorch"] = lambda: torch_seconds(workload, protocol)
    else:
        notes.append(f"PyTorch: timed on the CPU only, the programs run on {env.target}")
    medians, failures = interleave(timers, rounds)
    return dataclasses.replace(result, compared_start_s=medians.get("start program"),
                               compared_best_s=medians.get("best program"), torch_s=medians.get("PyTorch"),
                               compared_threads=protocol.threads, compared_note="; ".join(notes + failures) or None)


def interleave(timers: dict[str, Callable[[], float]], rounds: int) -> tuple[dict[str, float], list[str]]:
    """Median seconds per timer over `rounds` rounds that call every timer in turn, so all the figures are
    taken under the same load. A timer that fails is dropped at once, with a note that says why; the
    others go on."""
    live, times, failures = dict(timers), {name: [] for name in timers}, []
    for _ in range(rounds):
        for name, timer in list(live.items()):
            try:
                times[name].append(timer())
            except Exception as exc:  # noqa: BLE001  (a module or kernel that fails must not lose the search)
                failures.append(f"{name}: {exc}")
                del live[name]
    return {name: statistics.median(times[name]) for name in live}, failures


def describe(result: AgentResult) -> str:
    """The side-by-side figures in one line, e.g. `best 0.412 ms, start 16.7 ms (x40.5), PyTorch eager
    0.390 ms (best/PyTorch 1.06, 1 thread)`; what is missing is named with the reason."""
    if result.compared_start_s is None or result.compared_best_s is None:
        return f"side by side: not timed ({result.compared_note or 'agents.compare.compare was not run'})"
    threads = f"{result.compared_threads} thread{'s' if result.compared_threads != 1 else ''}"
    line = (f"best {_figure(result.compared_best_s * 1e3)} ms, start {_figure(result.compared_start_s * 1e3)} ms "
            f"(x{_figure(result.compared_speedup)})")
    if result.torch_s is None:
        return f"{line}, PyTorch eager not timed ({result.compared_note}), {threads}"
    return (f"{line}, PyTorch eager {_figure(result.torch_s * 1e3)} ms "
            f"(best/PyTorch {_figure(result.best_vs_torch)}, {threads})")


def _figure(x: float) -> str:
    """Three significant digits without an exponent: 0.412, 16.7, 1234."""
    digits = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 0
    return f"{x:.{digits}f}"
