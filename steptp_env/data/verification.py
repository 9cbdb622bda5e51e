"""Verifying dataset rows: build and check programs in worker processes, several at a time.

Every row a generator writes, an exporter keeps or an importer accepts is checked the same way:
`measure(..., timing=False)` builds the program in an isolated worker (a crash or hang is a result) and
compares it with the reference here. Parallel checks each get their own worker process.
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


def check(program: Program, reference: Reference, target: str = "llvm", protocol: Protocol | None = None,
          slot: int = 0) -> dict[str, Any]:
    """The verify report of `program` against `reference` as a dict (`equivalent`, errors, `reason`); a
    failed build or run is a report with `equivalent: false` and the failure as its `reason`."""
    protocol = protocol or Protocol()
    worker = worker_for(protocol.threads, slot)
    m = measure(program, reference, target, protocol, worker=worker, timing=False)
    gc.collect()  # free this check's arrays before the next one
    programs = [program] + ([reference] if isinstance(reference, Program) else [])
    if max(map(program_bytes, programs)) > RELEASE_BYTES:
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
