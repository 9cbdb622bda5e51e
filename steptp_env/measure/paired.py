"""Paired timing: how much faster one program is than another, measured in one worker run, interleaved.

Two runtimes measured minutes apart on a shared machine can differ by 2x, so a reward taken as the ratio of
two separate medians moves with the load. Timing both kernels in the same run, alternating their order
round by round (before, after, after, before, ...), exposes both to the same load; the ratio of each
round's pair is a paired sample, and the median of the rounds' log ratios, with a distribution-free 95%
interval (binomial order statistics), is robust to the rounds a busy neighbour interrupted. Rounds are
added until that interval is within `halfwidth` of the estimate, up to a cap in rounds and in seconds.
At one thread each timing is scaled by the share of its wall time the worker was running (CPU time over
wall time): a kernel longer than the scheduler's time slice is stretched by every neighbour that shares
its core, a short one only now and then, so wall-clock ratios of kernels of different lengths drift with
the load (measured: a 16 ms start program against its 0.6 ms reorder moved the reward by 0.14 with two
busy processes). The CPU time alone is not the timing: read around the call it adds the call's overhead,
which biased microsecond kernels (a program against itself measured 0.92).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

from ..ir.program import Program
from .verify import Reference

MIN_ROUNDS = 8
MAX_ROUNDS = 64
BUDGET_S = 4.0
HALFWIDTH = 0.03


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, median, high): the sample median and the order statistics that bracket the population median
    with probability >= `level` (exact binomial ranks; with fewer than 6 values, the whole range)."""
    ordered = sorted(values)
    n = len(ordered)
    tail, rank, below = (1 - level) / 2, 0, 0.0
    while rank + 1 <= n // 2 and below + math.comb(n, rank) / 2 ** n <= tail:  # P(Binomial(n, 1/2) <= rank) <= tail
        below += math.comb(n, rank) / 2 ** n
        rank += 1
    rank = max(rank, 1)
    return ordered[rank - 1], statistics.median(ordered), ordered[n - rank]


def within(values: list[float], halfwidth: float) -> bool:
    """Whether the 95% interval of the median log ratio lies within +-`halfwidth` (relative) of it."""
    low, mid, high = median_interval(values)
    return max(mid - low, high - mid) <= math.log1p(halfwidth)


def interleave(time_before: Callable[[], float], time_after: Callable[[], float], halfwidth: float = HALFWIDTH,
               min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS, budget_s: float = BUDGET_S,
               clock: Callable[[], float] | None = None) -> tuple[list[float], list[float]]:
    """Rounds of one timing of each kernel, order alternating, until the log ratios' interval is narrow
    enough (after at least `min_rounds`), `max_rounds` were taken, or `budget_s` seconds passed."""
    import time

    clock = clock or time.perf_counter
    before: list[float] = []
    after: list[float] = []
    start = clock()
    for number in range(max_rounds):
        if number % 2 == 0:
            before.append(time_before())
            after.append(time_after())
        else:
            after.append(time_after())
            before.append(time_before())
        if len(before) >= min_rounds and (within(log_ratios(before, after), halfwidth)
                                          or clock() - start > budget_s):
            break
    return before, after


def log_ratios(before: list[float], after: list[float]) -> list[float]:
    """Per round, log(before / after): positive when the second program is faster."""
    return [math.log(b / a) for b, a in zip(before, after)]


@dataclass
class PairedTiming:
    """The speedup of `after` over `before` (before / after) from interleaved rounds, with its 95%
    interval; `error` set (and no ratio) when either program could not be built or run."""

    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    rounds: int = 0
    before_s: float | None = None  # median seconds per run of each program in these rounds
    after_s: float | None = None
    halfwidth: float = HALFWIDTH
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    error: str | None = None
    timings: dict[str, list[float]] = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        """Whether the interval met the requested width (else the round or time cap ended it)."""
        if self.ratio is None:
            return False
        return max(self.ratio / self.low, self.high / self.ratio) <= 1 + self.halfwidth + 1e-12

    @classmethod
    def of(cls, before: list[float], after: list[float], halfwidth: float = HALFWIDTH, **extra) -> PairedTiming:
        low, mid, high = median_interval(log_ratios(before, after))
        return cls(math.exp(mid), math.exp(low), math.exp(high), len(before), statistics.median(before),
                   statistics.median(after), halfwidth, timings={"before": before, "after": after}, **extra)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the raw timings, and whether the interval met its width."""
        data = asdict(self)
        data.pop("timings")
        data["converged"] = self.converged
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairedTiming:
        """The inverse of `to_dict` (raw timings are not kept)."""
        known = {f.name for f in fields(cls)} - {"timings"}
        found = {k: v for k, v in data.items() if k in known}
        found["load_average"] = tuple(found.get("load_average", (0.0, 0.0, 0.0)))
        return cls(**found)


def measure_pair(before: Program, after: Program, workload: Reference, target: str = "llvm", protocol=None,
                 worker=None, halfwidth: float = HALFWIDTH, max_rounds: int = MAX_ROUNDS,
                 budget_s: float = BUDGET_S) -> PairedTiming:
    """Time `before` and `after` interleaved in one worker run (under the machine-wide timing lock, pinned
    as the protocol says) on the same inputs. Builds both where the worker does not hold them already; does
    not verify (the caller measures `after` with `measure` first). Never raises for a bad program."""
    import os

    from .runner import Protocol, _inputs_for_timing, timing_lock, worker_for
    from .worker import _ensure_built, _time_pair, kernel_key

    protocol = protocol or Protocol()
    worker = worker or worker_for(protocol.threads)
    keys = [kernel_key(p, target) for p in (before, after)]
    phase = "build"
    try:
        for key, program in zip(keys, (before, after)):
            worker.call(_ensure_built, key, program.leir, program.signature.to_json(), target,
                        timeout=protocol.build_timeout)
        phase = "paired timing"
        inputs = _inputs_for_timing(after, workload, protocol)
        with timing_lock():
            load = os.getloadavg()
            times = worker.call(_time_pair, keys[0], keys[1], inputs, protocol.min_seconds, halfwidth, max_rounds,
                                budget_s, timeout=protocol.run_timeout + budget_s)
        return PairedTiming.of(times["before"], times["after"], halfwidth, load_average=load)
    except TimeoutError:
        return PairedTiming(halfwidth=halfwidth, error=f"{phase} timed out")
    except ChildProcessError:
        return PairedTiming(halfwidth=halfwidth, error=f"{phase} crashed: the worker process died")
    except Exception as exc:  # whatever TVM raises in the child comes back here
        return PairedTiming(halfwidth=halfwidth, error=f"{phase} failed: {type(exc).__name__}: {str(exc)[-500:]}")
