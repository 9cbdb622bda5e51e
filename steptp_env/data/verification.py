"""Verifying dataset rows: build and check programs in worker processes, several at a time.

Every row a generator writes, an exporter keeps or an importer accepts is checked the same way:
`measure(..., timing=False, opt_level=VERIFY_OPT_LEVEL)` builds the program in an isolated worker (a crash
or hang is a result) and compares it with the reference here. Parallel checks each get their own worker
process, which builds nest by nest and keeps what it compiled (`measure.nest_build`): the rows of one
workload share most of their nests, so a row's check compiles the nests it changed and little else.
"""
from __future__ import annotations

import gc
import threading
from typing import Any, Callable, Sequence

from ..ir.program import Program, program_bytes
from ..measure import Protocol, measure
from ..measure.runner import map_in_slots, worker_for
from ..measure.verify import Reference


RELEASE_BYTES = 1 << 30
"""After checking a program whose tensors take more than this, its worker is restarted: TVM keeps freed
intermediates in a per-process workspace pool, so one large row would hold its memory through the run."""

VERIFY_OPT_LEVEL = 1
"""LLVM level of a verification build. Equivalence is a property of the LEIR program, and a checked kernel is
never timed, so it needs LLVM's cheap passes only: benchmarks/results/opt_level.md has O1 building and
JIT-linking in 62 ms against O3's 86 (median, 25 programs at `small`), its kernels at 0.83 of O3's speed,
which three verification runs of a small kernel do not notice (O0 builds faster still, and its kernels run
several times slower)."""

COLLECT_BYTES = 1 << 26
"""After checking a program whose tensors take more than this, this process runs a full garbage collection,
so that arrays caught in reference cycles are freed before the next check. Not after every check: with the
strategies' and TVM's objects alive a full collection takes ~0.3 s, which was 46% of `steptp generate`'s
CPU time at `small`, to free arrays that are small there."""


def check(program: Program, reference: Reference, target: str = "llvm", protocol: Protocol | None = None,
          slot: int = 0) -> dict[str, Any]:
    """The verify report of `program` against `reference` as a dict (`equivalent`, errors, `reason`); a
    failed build or run is a report with `equivalent: false` and the failure as its `reason`."""
    protocol = protocol or Protocol()
    worker = worker_for(protocol.threads, slot)
    m = measure(program, reference, target, protocol, worker=worker, timing=False, opt_level=VERIFY_OPT_LEVEL)
    programs = [program] + ([reference] if isinstance(reference, Program) else [])
    largest = max(map(program_bytes, programs))
    if largest > COLLECT_BYTES:
        gc.collect()  # free this check's arrays before the next one
    if largest > RELEASE_BYTES:
        worker.close()  # TVM's workspace pool keeps a kernel's intermediates; a new worker starts empty
    if m.verify is None:
        return {"equivalent": False, "reason": m.error or "not verified", "trials": 0}
    return m.verify.to_dict()


Checked = Callable[[int, int], None]
"""`checked(done, total)`: called after each check of a `check_many` call (a progress display)."""


def check_many(items: Sequence[tuple[Program, Reference]], target: str = "llvm", protocol: Protocol | None = None,
               workers: int = 1, checked: Checked | None = None) -> list[dict[str, Any]]:
    """`check` for each (program, reference), `workers` at once; reports in input order."""
    done, lock = [0], threading.Lock()

    def count() -> None:
        if checked is not None:
            with lock:
                done[0] += 1
                checked(done[0], len(items))

    def one(item: tuple[Program, Reference], slot: int = 0) -> dict[str, Any]:
        try:
            return check(item[0], item[1], target, protocol, slot)
        finally:
            count()

    if workers <= 1 or len(items) <= 1:
        return [one(item) for item in items]
    return map_in_slots(one, items, workers)
