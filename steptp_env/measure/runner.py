"""`measure`: build, verify against the workload, then time: the full cost of one environment step.

Everything native (compiling, running, timing) happens in a worker process under a per-phase timeout;
the PyTorch reference and the comparison run here. A build that fails, hangs or crashes, a kernel that
segfaults or hangs, and a wrong result all come back as a `Measurement` with `error` set.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import os
import queue
import re
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ..errors import StepTPError
from ..ir.program import Program
from .context import versions
from .verify import Reference, VerifyReport, precheck, verify
from .worker import MeasureWorker, _build, _load, _release, _run, _time, _upload, kernel_key


def _default_threads() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Protocol:
    """How a runtime is measured. The thread count is part of it: the machine's cores by default, so that
    parallel loops pay off; 1 gives the steadiest figures on a busy machine."""

    threads: int = field(default_factory=_default_threads)
    repeat: int = 5
    number: int = 1
    min_seconds: float = 1e-4  # kernels faster than this get `number` raised so one timing lasts this long
    trials: int = 3
    seed: int = 0
    build_timeout: float = 120.0
    run_timeout: float = 60.0

    @property
    def key(self) -> str:
        """What makes two timings comparable (timeouts and verify seeds do not)."""
        return f"threads={self.threads};repeat={self.repeat};number={self.number};min_seconds={self.min_seconds}"


UPLOAD = "upload to an RPC device"
"""The phase of a remote measurement that leases the device: a failure there is the device's, not the
program's (`measure.farm` sends such a measurement again)."""


@dataclass(frozen=True)
class Remote:
    """A device leased from a TVM RPC tracker (`rpc://host:port/key`): built here, run there."""

    host: str
    port: int
    key: str
    session_timeout: float = 600.0

    @classmethod
    def parse(cls, url: str) -> Remote:
        match = re.fullmatch(r"rpc://([^:/]+):(\d+)/(\S+)", url)
        if match is None:
            raise StepTPError(f"not an RPC device address: {url!r} (expected rpc://host:port/key)")
        return cls(match.group(1), int(match.group(2)), match.group(3))

    @classmethod
    def of(cls, value: Remote | str) -> Remote:
        """`value` itself, or the device address `rpc://host:port/key` it spells parsed."""
        return cls.parse(value) if isinstance(value, str) else value

    @property
    def url(self) -> str:
        return f"rpc://{self.host}:{self.port}/{self.key}"


@dataclass
class Measurement:
    """One program measured on one target under one protocol."""

    leir: str
    target: str
    protocol: Protocol
    timings: list[float] = field(default_factory=list)
    number: int = 1
    verify: VerifyReport | None = None
    error: str | None = None
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    versions: dict[str, str] = field(default_factory=dict)
    build_s: float = 0.0
    verify_s: float = 0.0
    time_s: float = 0.0
    device: str | None = None  # host:port of the RPC server that ran it (None: this machine)

    @property
    def ok(self) -> bool:
        return self.error is None and self.verify is not None and self.verify.equivalent

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.timings) if self.timings else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verify"] = None if self.verify is None else self.verify.to_dict()
        data["median_s"] = self.median_s
        return data


_WORKERS: dict[tuple[int, int], MeasureWorker] = {}
_WORKERS_LOCK = threading.Lock()
TIMING_LOCK = threading.Lock()
"""Held (with the machine-wide file lock, see `timing_lock`) while a kernel is timed."""


def timing_lock_path() -> Path:
    """$STEPTP_TIMING_LOCK, else one file in /tmp (whatever a process's TMPDIR says): every process of every
    user on the machine meets the same one."""
    default = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return Path(os.environ.get("STEPTP_TIMING_LOCK") or default / "steptp_env-timing.lock")


@contextlib.contextmanager
def timing_lock() -> Iterator[None]:
    """One timing at a time on the whole machine: this process's threads queue on TIMING_LOCK, processes
    (vectorised envs, generate workers, benchmarks) on an exclusive `flock` of `timing_lock_path()`, which
    the kernel releases when a holder dies. Builds and verification run outside it."""
    with TIMING_LOCK:
        path = timing_lock_path()
        with open(path, "a") as handle:
            with contextlib.suppress(PermissionError):
                os.chmod(path, 0o666)  # other users of the machine must be able to open it too
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def settle_workers(window_s: float = 0.05, cap_s: float = 3.0) -> float:
    """Wait until this process's child processes (the measurement workers) have used no CPU for one window,
    at most `cap_s`; the seconds waited. After a kernel with parallel loops, the worker's TVM thread pool
    keeps spinning for up to about a second; a multi-threaded timing taken meanwhile in this process shares
    its cores with the spinning threads: PyTorch's two OpenMP threads took 8 ms a call for a 0.2 ms batched
    matmul on the 2-core machine. CPU times advance in clock ticks (10 ms), so a window under one tick of
    CPU counts as idle."""
    import psutil

    me, start = psutil.Process(), time.perf_counter()

    def used() -> float:
        total = 0.0
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                total += times.user + times.system
        return total

    before = used()
    while time.perf_counter() - start < cap_s:
        time.sleep(window_s)
        after = used()
        if after - before < 0.01:
            break
        before = after
    return time.perf_counter() - start


def worker_for(threads: int, slot: int = 0) -> MeasureWorker:
    """The shared worker process for a thread count (and a slot, for parallel builds)."""
    with _WORKERS_LOCK:
        key = (threads, slot)
        if key not in _WORKERS:
            _WORKERS[key] = MeasureWorker(threads)
        return _WORKERS[key]


def measure(program: Program, workload: Reference, target: str = "llvm", protocol: Protocol | None = None,
            worker: MeasureWorker | None = None, remote: Remote | str | None = None,
            timing: bool = True, library: str | Path | None = None,
            beside: Callable[[], Any] | None = None, opt_level: int | None = None) -> Measurement:
    """Build `program`, verify it against `workload` (a Workload, a Program or a NumPy callable), and time
    it if it is equivalent. With `remote` (a `Remote` or `rpc://host:port/key`) the kernel runs on a device
    leased from that RPC tracker for the measurement (`device` names it). `timing=False` stops after
    verification (no timings). With `library` (a kernel library of `program`'s signature compiled
    elsewhere, e.g. MetaSchedule's) that library is loaded in place of the build, then verified and timed
    the same way. `beside` runs here while the worker builds (`MeasureWorker.call`): the caller's work on
    the program that does not wait for its runtime, overlapped with the build. `opt_level` (LLVM's, with
    `timing=False` only: a timed kernel is always built as the measurement protocol builds it, at TVM's
    default 3) builds a kernel whose semantics alone are checked; on this machine's CPU it is built nest by
    nest, reusing the nests the worker compiled for earlier checks (`nest_build`). Never raises for a bad
    program: failures come back with `error` set."""
    if opt_level is not None and (timing or library is not None):
        raise ValueError("opt_level is for untimed checks of a program built here (timing=False, no library)")
    protocol = protocol or Protocol()
    worker = worker or worker_for(protocol.threads)
    remote = None if remote is None else Remote.of(remote)
    if library is not None and (remote is not None or target != "llvm"):
        raise ValueError("a prebuilt library is measured on this machine's CPU (target llvm, no remote)")
    m = Measurement(program.leir, target if remote is None else f"{target}@{remote.url}", protocol,
                    versions=versions())
    key = kernel_key(program, target if remote is None else f"{target}@{remote.url}")
    by_nest = opt_level is not None and remote is None and target.split()[0] == "llvm"
    if opt_level is not None:
        key += f"/O{opt_level}"  # never the timed O3 kernel of the same program
    signature = program.signature.to_json()

    early: list[VerifyReport | None] = []

    def meanwhile() -> None:  # beside the build: the check that needs no run, then the caller's work
        early.append(precheck(program))
        if beside is not None:
            beside()

    phase = "build"
    try:
        if library is None:
            m.build_s = worker.call(_build, key, program.leir, signature, target, opt_level, by_nest,
                                    timeout=protocol.build_timeout, beside=meanwhile)
        else:
            key = f"{key}/library:{Path(library).resolve()}"
            m.build_s = worker.call(_load, key, str(library), program.leir, signature, timeout=protocol.build_timeout,
                                    beside=meanwhile)
        if remote is not None:
            phase = UPLOAD
            m.device = worker.call(_upload, key, (remote.host, remote.port), remote.key, remote.session_timeout,
                                   timeout=protocol.build_timeout)
        run_reference = None
        if isinstance(workload, Program) and remote is None:  # a reference program runs in the worker too
            phase = "build of the reference program"
            worker.call(_build, key + "/reference", workload.leir, workload.signature.to_json(), target, opt_level,
                        by_nest, timeout=protocol.build_timeout)
            run_reference = lambda inputs: worker.call(_run, key + "/reference", [inputs],  # noqa: E731
                                                       timeout=protocol.run_timeout)[0][0]
        phase = "verification run"
        start = time.perf_counter()
        m.verify = early[0] if early and early[0] is not None else verify(
            program, workload, trials=protocol.trials, seed=protocol.seed, target=target,
            runner=lambda sets: worker.call(_run, key, sets, timeout=protocol.run_timeout),
            run_reference=run_reference, prechecked=bool(early))
        m.verify_s = time.perf_counter() - start
        if not m.verify.equivalent:
            m.error = f"not equivalent: {m.verify.reason}"
            return m
        if not timing:
            return m
        phase = "timing"
        inputs = _inputs_for_timing(program, workload, protocol)
        with timing_lock() if remote is None else contextlib.nullcontext():  # a device is timed alone anyway
            start = time.perf_counter()
            m.load_average = os.getloadavg()
            *timings, number = worker.call(_time, key, inputs, protocol.number, protocol.repeat,
                                           protocol.min_seconds, timeout=protocol.run_timeout)
            m.time_s = time.perf_counter() - start
        m.number = int(number)
        m.timings = [t for t in timings]
    except TimeoutError:
        limit = protocol.build_timeout if phase.startswith("build") or phase == UPLOAD else protocol.run_timeout
        m.error = f"{phase} timed out (limit {limit:.0f} s)"
    except ChildProcessError:
        m.error = f"{phase} crashed: the worker process died (segfault, abort or out of memory)"
    except StepTPError as exc:
        m.error = f"{phase} failed: {exc}"
    except Exception as exc:  # whatever TVM raises in the child comes back here
        m.error = f"{phase} failed: {type(exc).__name__}: {str(exc)[-1500:]}"
    finally:
        if remote is not None:  # end the lease: the tracker gives the device to the next request
            with contextlib.suppress(Exception):
                worker.call(_release, key, timeout=protocol.run_timeout)
    return m


def _inputs_for_timing(program: Program, workload: Reference, protocol: Protocol):
    if hasattr(workload, "make_inputs"):
        return workload.make_inputs(protocol.seed)
    from .inputs import random_inputs

    return random_inputs(program, protocol.seed)


def measure_many(programs: Sequence[Program], workload: Reference, target: str = "llvm",
                 protocol: Protocol | None = None, workers: int = 1,
                 remote: Remote | str | None = None) -> list[Measurement]:
    """Measure several programs, building in up to `workers` processes at once; timings stay serial (a
    shared lock), so parallel builds do not disturb them. Results are in input order. With `remote`, on
    the RPC farm behind that tracker instead, one measurement per device at a time (`measure.farm`)."""
    if remote is not None:
        from .farm import measure_farm

        return measure_farm(programs, workload, remote, target, protocol).results
    protocol = protocol or Protocol()
    if workers <= 1:
        return [measure(p, workload, target, protocol) for p in programs]
    return map_in_slots(lambda program, slot: measure(program, workload, target, protocol,
                                                      worker_for(protocol.threads, slot)), programs, workers)


Item = TypeVar("Item")
Result = TypeVar("Result")


def map_in_slots(fn: Callable[[Item, int], Result], items: Sequence[Item], slots: int) -> list[Result]:
    """`fn(item, slot)` for every item, at most `slots` calls at once, each holding a slot number no other
    running call holds (so each uses a worker process of its own, `worker_for(threads, slot)`); results in
    input order."""
    free: queue.Queue[int] = queue.Queue()
    for slot in range(slots):
        free.put(slot)

    def one(item: Item) -> Result:
        slot = free.get()
        try:
            return fn(item, slot)
        finally:
            free.put(slot)

    with cf.ThreadPoolExecutor(slots) as pool:
        return list(pool.map(one, items))
