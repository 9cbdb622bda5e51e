"""`generate` over Ray: the workloads are work items for a pool of actors (the `ray` extra).

Each actor holds a generator of its own (an env per workload, the packaged cost model, one verification
worker) and generates one workload at a time into memory. The driver alone writes `steps.jsonl`: a
workload's records, then its `done` record, once its actor returns them all. So the file keeps the local
path's resumability (a restart skips finished workloads and written keys), and an actor that dies in the
middle of a workload loses that workload's unwritten work and nothing else: it is not marked done (a rerun
does it), the run goes on, and a new actor takes the dead one's place. In model mode the rows are the local
path's, key for key: a workload's work depends only on the seed, the workload and the frozen model. Hybrid
mode's online model is one per actor, so its predictions (not its verified rows' keys) can differ.

`ray="local"` starts Ray on this machine with one CPU per actor; any other value is the address of a running
cluster (`ray://head:10001`, or `auto` from a node of it), where `out` must be a path the actors can write
their result store under.
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ..measure import ResultStore
from .generate import GenerateConfig, GenerateResult, StepsFile, _count, _Generator, _remember


class _Collect(list):
    def write(self, record: dict[str, Any]) -> None:
        self.append(record)


class WorkloadActor:
    """What one Ray actor runs (a plain class: `generate_ray` makes it remote)."""

    def __init__(self, config: GenerateConfig, out: str) -> None:
        self.generator = _Generator(replace(config, workers=1), Path(out), None, sink=_Collect())

    def pid(self) -> int:
        return os.getpid()

    def run(self, uri: str, keys: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The records of one workload's unwritten work (`keys`: what the file already holds) and the
        counts written, rejected and skipped."""
        gen = self.generator
        gen.keys, gen.writer, gen.result = dict(keys), _Collect(), GenerateResult()
        gen.run_workload(uri)
        counts = {"written": gen.result.written, "rejected": gen.result.rejected, "skipped": gen.result.skipped}
        return list(gen.writer), counts


Started = Callable[[str, int], None]
"""`started(uri, pid)`: a workload was sent to the actor process `pid` (tests kill one there)."""


def generate_ray(config: GenerateConfig, out: Path | str, address: str = "local", actors: int = 2,
                 time_limit: float | None = None, progress: Callable[[str, GenerateResult], None] | None = None,
                 started: Started | None = None) -> GenerateResult:
    """`generate` with workloads spread over `actors` Ray actors (see the module docstring). The time limit
    stops sending new workloads; those already sent finish. `result.lost` lists the workloads whose actor
    died."""
    import ray

    out = Path(out)
    start = time.monotonic()
    steps = StepsFile(config, out)
    ResultStore(out / "store.sqlite").close()  # the actors share it: its tables exist before they race to open it
    if address == "local":
        ray.init(num_cpus=actors, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_restarts=0)(WorkloadActor)
    result = GenerateResult()
    todo = []
    for uri in config.workloads:
        if config.prefix(uri) in steps.finished:
            result.workloads_done += 1
        else:
            todo.append(uri)
    pids: dict[Any, int] = {}

    def new_actor():
        actor = remote.remote(config, str(out.resolve()))
        if started is not None:  # asked before any work: an actor runs its calls one at a time
            pids[actor] = ray.get(actor.pid.remote())
        return actor

    idle = [new_actor() for _ in range(min(actors, len(todo)))]
    running: dict[Any, tuple[Any, str]] = {}
    try:
        while todo or running:
            expired = time_limit is not None and time.monotonic() - start > time_limit
            while todo and idle and not expired:
                actor, uri = idle.pop(), todo.pop(0)
                prefix = config.prefix(uri)
                keys = {k: v for k, v in steps.keys.items() if k.startswith(prefix + "|")}
                running[actor.run.remote(uri, keys)] = (actor, uri)
                if started is not None:
                    started(uri, pids[actor])
            if expired and todo:
                result.stopped_early, todo = True, []
            if not running:
                break
            (ready,), _ = ray.wait(list(running), num_returns=1)
            actor, uri = running.pop(ready)
            try:
                records, counts = ray.get(ready)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                result.lost.append(f"{uri}: {type(exc).__name__}")
                idle.append(new_actor())
                continue
            for record in records:
                steps.writer.write(record)
                _remember(steps.keys, record)
            result.written += counts["written"]
            result.rejected += counts["rejected"]
            result.skipped += counts["skipped"]
            result.workloads_done += 1
            idle.append(actor)
            if progress is not None:
                progress(uri, result)
    finally:
        steps.writer.close()
        if address == "local":
            ray.shutdown()
    result.elapsed_s = time.monotonic() - start
    _count(steps.path, result)
    return result
