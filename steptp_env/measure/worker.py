"""Builds and runs kernels in a separate process, one phase per request, each under its own timeout.

TVM's `PopenWorker` keeps one child process alive between requests (so TVM is imported once) and kills
it when a request outlives its timeout; a kernel that segfaults or exhausts memory ends only the child.
Either way the parent gets an exception it turns into a failed `Measurement`, and the next request
starts a fresh child. The kernel built by one request is kept in the child for the following ones.
"""
from __future__ import annotations

import collections
import contextlib
import os
import pickle
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

_KERNELS: "collections.OrderedDict[str, Any]" = collections.OrderedDict()  # in the child: recent kernels
_KEEP = 4
PIPE_LIMIT = 1 << 30
"""Arguments or results holding more array bytes than this travel through a temporary file: TVM's
`PopenWorker` frames each message with a 32-bit length, so one over 2 GiB ends the child (`struct.error`)."""


@dataclass(frozen=True)
class _InFile:
    """A pickled value left in a temporary file (the receiver loads and deletes it)."""

    path: str


def _nbytes(value: Any) -> int:
    """Array bytes inside nested lists, tuples and dicts."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _pack(value: Any, limit: int) -> Any:
    """`value`, or an `_InFile` holding it when it has more than `limit` array bytes."""
    if _nbytes(value) <= limit:
        return value
    handle, path = tempfile.mkstemp(prefix="steptp-", suffix=".pickle")
    with os.fdopen(handle, "wb") as out:
        pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
    return _InFile(path)


def _unpack(value: Any) -> Any:
    if not isinstance(value, _InFile):
        return value
    try:
        with open(value.path, "rb") as stream:
            return pickle.load(stream)
    finally:
        os.unlink(value.path)


def _serve(fn, args, limit: int) -> Any:
    """Child side: every request runs through here, so large arguments and results take the file route."""
    return _pack(fn(*_unpack(args)), limit)


def _build(key: str, leir: str, signature: list, target: str, opt_level: int | None = None,
           by_nest: bool = False) -> float:
    """Child side: parse, lower, compile (at LLVM level `opt_level`, 3 when None) and (on the CPU) JIT-link
    the entry function; returns the seconds it took. The link (LLVM's machine-code generation, as long as the
    build for heavy programs) is done here rather than at the first run, so that the caller's work beside the
    build (`MeasureWorker.call`) overlaps it too. `by_nest`: a kernel for checks, compiled nest by nest
    with the nests this child compiled before reused (`nest_build`)."""
    import time

    from ..ir.program import Program
    from .build import build
    from .nest_build import build_by_nest

    start = time.perf_counter()
    program = Program.parse(leir, signature)
    _KERNELS[key] = build_by_nest(program, opt_level) if by_nest else build(program, target, opt_level)
    _KERNELS[key].link()
    while len(_KERNELS) > _KEEP:  # memory stays bounded; requests of concurrent callers stay apart
        _KERNELS.popitem(last=False)
    return time.perf_counter() - start


def _load(key: str, path: str, leir: str, signature: list) -> float:
    """Child side: load a kernel library built elsewhere (MetaSchedule's, `metaschedule.tune_library`) as the
    kernel of `leir` under `key`, so that it is verified and timed like a kernel built here."""
    import time

    import tvm

    from ..ir.program import Program
    from .build import Kernel

    start = time.perf_counter()
    _KERNELS[key] = Kernel.loaded(Program.parse(leir, signature), tvm.runtime.load_module(path))
    while len(_KERNELS) > _KEEP:
        _KERNELS.popitem(last=False)
    return time.perf_counter() - start


def kernel_key(program, target: str) -> str:
    """The name a built kernel has in the worker: its program and target, so that a later request for the
    same program (a paired timing after its measurement) finds it built."""
    import hashlib
    import json

    text = "\0".join((program.leir, json.dumps(program.signature.to_json(), sort_keys=True), target))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _ensure_built(key: str, leir: str, signature: list, target: str) -> float:
    """Child side: build unless this child holds the kernel already (then 0 seconds)."""
    if key in _KERNELS:
        _KERNELS.move_to_end(key)
        return 0.0
    return _build(key, leir, signature, target)


def paired_timings(kernels: Sequence, inputs: dict[str, np.ndarray], min_seconds: float, threads: int,
                   **interleaving: Any) -> tuple[list[float], list[float]]:
    """Two kernels timed in alternating rounds (`paired.interleave`, its options in `interleaving`), each
    timing long enough (`min_seconds`) for the timer; seconds per run for each. At one thread the calling
    thread is pinned and each timing is scaled by the share of it the process was running (`Kernel.timer`),
    so a busy neighbour's share of the core does not enter it. The worker's paired measurement and
    benchmarks/opt_level.py take their ratios this one way."""
    from .paired import interleave

    with pinned(threads):
        probes = [k.time(inputs, number=1, repeat=1, warmup=False)[0] for k in kernels]  # TVM warms up
        timers = [k.timer(inputs, runs_per_timing(probe, 1, min_seconds), scaled=threads == 1, probe_s=probe)
                  for k, probe in zip(kernels, probes)]
        return interleave(*timers, **interleaving)


def _time_pair(key_before: str, key_after: str, inputs: dict[str, np.ndarray], min_seconds: float,
               halfwidth: float, max_rounds: int, budget_s: float) -> dict[str, list[float]]:
    """Child side: `paired_timings` of two kernels this child holds, at the protocol's thread count."""
    before, after = paired_timings([_KERNELS[key_before], _KERNELS[key_after]], inputs, min_seconds,
                                   int(os.environ.get("TVM_NUM_THREADS") or 0), halfwidth=halfwidth,
                                   max_rounds=max_rounds, budget_s=budget_s)
    return {"before": before, "after": after}


def _kernel_seconds() -> float:
    """Child side: the seconds this child has spent inside kernel calls (`build.RunClock`)."""
    from .build import RunClock

    return RunClock.seconds


def _run(key: str, inputs: list[dict[str, np.ndarray]]) -> list[tuple[dict, list[str]]]:
    """Child side: run the built kernel once per input set; (outputs, names of changed inputs) per set."""
    kernel = _KERNELS[key]
    return [kernel.run_checked(arrays) for arrays in inputs]


def _time(key: str, inputs: dict[str, np.ndarray], number: int, repeat: int, min_seconds: float) -> list[float]:
    """Child side: one warm-up run (timed, to raise `number` so one timing lasts at least `min_seconds`),
    then `repeat` timings of `number` runs each (around direct calls for a kernel of `DIRECT_TIMING_S` or
    more, else by TVM's evaluator)."""
    kernel = _KERNELS[key]
    with pinned(int(os.environ.get("TVM_NUM_THREADS") or 0)):
        probe = kernel.time(inputs, number=1, repeat=1, warmup=False)[0]
        number = runs_per_timing(probe, number, min_seconds)
        return kernel.time(inputs, number=number, repeat=repeat, warmup=False, probe_s=probe) + [float(number)]


@contextlib.contextmanager
def pinned(threads: int):
    """While a one-thread protocol is timed (`threads == 1`), the calling thread, which runs a one-thread
    TVM kernel or PyTorch call, stays on one core, the highest the process may use, so the scheduler cannot
    move it mid-timing and cost it its caches; the previous affinity comes back afterwards. Shared by the
    kernel timings here and PyTorch's in `agents.compare`."""
    if threads != 1 or not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def runs_per_timing(probe: float, number: int, min_seconds: float) -> int:
    """Runs per timing: `number`, raised (when it is 1) so that one timing lasts at least `min_seconds`
    for a run that took `probe` seconds; the timer's resolution and overhead stay small beside it. Shared
    by the kernel timings here and PyTorch's in `agents.compare`, so both are taken the same way."""
    if probe < min_seconds and number == 1:
        return max(1, int(min_seconds / max(probe, 1e-9)))
    return number


def _crash() -> None:
    """Child side: end the process as a native crash would (used by the isolation tests)."""
    import ctypes

    ctypes.string_at(0)


@contextlib.contextmanager
def _thread_env(threads: int):
    """TVM reads TVM_NUM_THREADS when the child imports it, so it must be set when a child starts."""
    saved = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = saved


class MeasureWorker:
    """A child process running with `threads` TVM threads. One request at a time (a lock guards it)."""

    GRACE_S = 5.0

    def __init__(self, threads: int) -> None:
        from tvm.support.popen_pool import PopenWorker

        self.threads = threads
        self._worker = PopenWorker()
        self.lock = threading.Lock()

    def call(self, fn, *args, timeout: float, beside: Callable[[], Any] | None = None) -> Any:
        """Run `fn(*args)` in the child. Raises TimeoutError when it outlives `timeout` (the child is
        killed from here too, in case native code holds it), ChildProcessError when the child dies.
        `beside` runs in this thread while the child works (a step's own work that does not need the
        child's answer, done on another core meanwhile); an exception it raises is dropped: it is
        speculative work, which the code that needs its result repeats, and fails, in its own place."""
        packed = _pack(args, PIPE_LIMIT)
        try:
            return self._call(fn, packed, timeout, beside)
        finally:  # the child deletes a file it read; one it never reached (it died first) goes here
            if isinstance(packed, _InFile) and os.path.exists(packed.path):
                os.unlink(packed.path)

    def _call(self, fn, packed: Any, timeout: float, beside: Callable[[], Any] | None) -> Any:
        with self.lock:
            with _thread_env(self.threads):
                self._worker.send(_serve, (fn, packed, PIPE_LIMIT), timeout=timeout)  # starts a child if there is none
            proc = self._worker._proc
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                proc.kill()

            timer = threading.Timer(timeout + self.GRACE_S, kill)
            timer.start()
            if beside is not None:
                with contextlib.suppress(Exception):
                    beside()
            try:
                return _unpack(self._worker.recv())
            except ChildProcessError:
                self._worker.kill()
                if killed.is_set():
                    raise TimeoutError(f"no answer within {timeout:.0f} s") from None
                raise
            finally:
                timer.cancel()

    def close(self) -> None:
        self._worker.kill()


def _upload(key: str, tracker: tuple[str, int], device_key: str, session_timeout: float) -> str:
    """Child side: lease a device from an RPC tracker, upload the kernel built under `key` and load it there;
    the device's host:port. The lease lasts until `_release(key)`."""
    import tempfile

    kernel = _KERNELS[key]
    session, device = _lease(tracker, device_key, session_timeout)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/{key}.so"
        kernel.executable.export_library(path)
        session.upload(path)
    kernel.attach_remote(session, session.load_module(f"{key}.so"), session.cpu())
    return device


def _lease(tracker: tuple[str, int], device_key: str, session_timeout: float):
    """(an RPC session, 'host:port' of its server): TVM's `TrackerSession.request` without its retry
    loop, which does not say which server the tracker chose."""
    from tvm import rpc
    from tvm.rpc import base

    client = rpc.connect_tracker(*tracker)
    try:
        base.sendjson(client._sock, [base.TrackerCode.REQUEST, device_key, "", 1])
        value = base.recvjson(client._sock)
    finally:
        client.close()
    if value[0] != base.TrackerCode.SUCCESS:
        raise RuntimeError(f"the tracker refused a {device_key} device: {value}")
    host, port, match = value[1]
    return rpc.connect(host, port, match, session_timeout=session_timeout), f"{host}:{port}"


def _release(key: str) -> None:
    """Child side: drop a kernel (and so the RPC session, the device's lease, that a remote kernel holds)."""
    _KERNELS.pop(key, None)
