"""`generate`: verified training steps at scale, over workloads x strategies, resumable after any crash.

One-step mode (`steps=1`) tries, for every workload and every strategy, up to `per_strategy` of its
candidate actions on the workload's starting program (a seeded choice). Multi-step mode (`steps=n`) takes
`walks` seeded random walks of n steps per workload, choosing a strategy uniformly among those with
candidates and then one of its candidates, so rare strategies are not drowned by loop splits.

Each step goes through the env (wrapped in the `Recorder`, so rows carry runtimes, their source and the
strategy's explanation) and is then verified against the workload's PyTorch reference in worker
processes, `workers` builds at once (the env's model mode does not verify). Only verified steps are
written as `step` records; a step that fails is written as a `rejected` record with its reason, and ends
its walk. Every record carries its work key (workload, preset, dtype, target, action path), and a
workload whose work is all written gets a `done` record: a restart reads the file and skips all of that,
so a killed run loses only unwritten work and never duplicates a row. A verification that timed out or
whose worker died is written as a rejection marked `transient`, and its workload is not marked done: a
restart tries that step again (on a loaded machine a build can pass its timeout).
"""
from __future__ import annotations

import datetime
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..measure import Protocol, ResultStore
from ..measure.runner import versions
from ..strategies import REGISTRY, STRATEGY_NAMES
from .records import JsonlWriter, read_records
from .recorder import Recorder
from .verification import check_many

STEPS_FILE = "steps.jsonl"
_RESUME_FIXED = ("preset", "dtype", "target", "mode", "steps", "seed", "strategies")
"""Settings a resumed run must share with the file's header (the others only widen or narrow the work)."""


@dataclass(frozen=True)
class GenerateConfig:
    workloads: tuple[str, ...]
    preset: str = "small"
    dtype: str = "float32"
    target: str = "llvm"
    mode: str = "model"
    steps: int = 1
    per_strategy: int = 2
    walks: int = 4
    seed: int = 0
    workers: int = 2
    strategies: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies or () if s not in REGISTRY]
        if unknown:
            raise ValueError(f"strategies not implemented: {', '.join(unknown)}")
        if self.steps < 1 or self.per_strategy < 1 or self.walks < 1 or self.workers < 1:
            raise ValueError("steps, per_strategy, walks and workers must be at least 1")

    def prefix(self, uri: str) -> str:
        return f"{uri}|{self.preset}|{self.dtype}|{self.target}"


@dataclass
class Job:
    """One walk (a single step in one-step mode): records of its steps, verified in order."""

    episode: str
    records: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[str, Any] | None = None


class _Buffer(list):
    def write(self, record: dict[str, Any]) -> None:
        if record["kind"] == "step":
            self.append(record)


@dataclass
class GenerateResult:
    """Counts of this run (`written`, `rejected`, `skipped` work already in the file) and, from the whole
    file, verified rows and rejections per strategy."""

    written: int = 0
    rejected: int = 0
    skipped: int = 0
    workloads_done: int = 0
    elapsed_s: float = 0.0
    stopped_early: bool = False
    rows_by_strategy: Counter = field(default_factory=Counter)
    rejected_by_strategy: Counter = field(default_factory=Counter)
    rows_by_workload: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # workloads whose Ray actor died (not done: a rerun does them)

    def to_dict(self) -> dict[str, Any]:
        return {k: dict(sorted(v.items())) if isinstance(v, Counter) else v for k, v in vars(self).items()}


def _read_existing(path: Path, config: GenerateConfig) -> tuple[dict[str, str], set[str]]:
    """(work key -> record kind, finished workload prefixes) of an existing file; checks its header."""
    keys: dict[str, str] = {}
    finished: set[str] = set()
    if not path.exists():
        return keys, finished
    for record in read_records(path):
        if record["kind"] == "header":
            old = record.get("config", {})
            differ = [k for k in _RESUME_FIXED if old.get(k) != _jsonable(asdict(config)).get(k)]
            if differ:
                raise ValueError(f"{path} was generated with other settings ({', '.join(differ)}); "
                                 "use another output folder")
        elif record["kind"] == "done":
            finished.add(record["key"])
        else:
            _remember(keys, record)
    return keys, finished


def _remember(keys: dict[str, str], record: dict[str, Any]) -> None:
    """Note a written record's work key as done (a step, or a rejection that is a verdict on the program),
    so a resumed run skips it; a transient rejection is not one."""
    if record.get("key") and record["kind"] in ("step", "rejected") and not record.get("transient"):
        keys[record["key"]] = record["kind"]


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def _names(config: GenerateConfig) -> list[str]:
    chosen = config.strategies or tuple(REGISTRY)
    return [n for n in STRATEGY_NAMES if n in chosen]


class StepsFile:
    """A run's `out/steps.jsonl`, open for appending: the work keys it already holds, the workloads it marks
    done, and its writer. The local generator writes through it; so does the Ray driver, which generates
    nothing itself and so needs no env, model or store."""

    def __init__(self, config: GenerateConfig, out: Path) -> None:
        self.path = out / STEPS_FILE
        self.keys, self.finished = _read_existing(self.path, config)
        created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.writer = JsonlWriter(self.path, {"config": _jsonable(asdict(config)), "versions": versions(),
                                              "created": created})


class _Generator:
    """Generates workloads into `out/steps.jsonl`, or, with a `sink`, into the sink alone (a Ray actor's
    records for one workload, which the driver writes when the whole workload is done)."""

    def __init__(self, config: GenerateConfig, out: Path, deadline: float | None, sink: Any = None) -> None:
        from ..costmodel import default_model

        self.config, self.deadline = config, deadline
        if sink is None:
            steps = StepsFile(config, out)
            self.path, self.keys, self.finished, sink = steps.path, steps.keys, steps.finished, steps.writer
        else:
            self.path, self.keys, self.finished = out / STEPS_FILE, {}, set()
        self.writer = sink
        self.store = ResultStore(out / "store.sqlite")
        # model mode shares the frozen packaged model; hybrid learns online, on one copy for the whole run
        self.model = None if config.mode == "measure" else default_model()
        if config.mode == "hybrid":
            self.model = self.model.copy()
        self.protocol = Protocol(threads=1)
        self.result = GenerateResult()
        self.retry = False  # this workload has a transient failure to try again

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def env(self, uri: str) -> Recorder:
        from ..env import StepTPEnv

        c = self.config
        # every step is verified below, in worker processes, so the env does not verify it again
        env = StepTPEnv(uri, c.preset, mode=c.mode, target=c.target, dtype=c.dtype, max_steps=c.steps,
                        store=self.store, model=self.model, protocol=self.protocol, verify_steps=False)
        return Recorder(env, sink=_Buffer())

    # -- planning: run the env to get each job's steps -----------------------------------------------------
    def _step(self, env: Recorder, job: Job, key: str, text: str, depth: int = 1) -> bool:
        """Take step number `depth` of a job (recorded unless its key is already written); False when the
        job ends here."""
        known = self.keys.get(key)
        if known is not None:
            self.result.skipped += 1
        _, _, _, _, info = env.step(text)
        if known is not None:
            env.sink.clear()
            return known == "step" and info["error"] is None
        record = env.sink.pop()
        if info["error"] is not None:
            job.rejected = self._rejection(key, record, info["error"])
            return False
        record.update(episode=job.episode, step=depth, key=key)
        job.records.append(record)
        return True

    @staticmethod
    def _rejection(key: str, record: dict[str, Any], reason: str) -> dict[str, Any]:
        return {"kind": "rejected", "key": key, "workload": record["workload"], "strategy": record.get("strategy")
                or record["action"].partition("(")[0], "action": record["action"], "reason": reason}

    def one_step_jobs(self, env: Recorder, uri: str) -> list[Job]:
        c, prefix = self.config, self.config.prefix(uri)
        env.reset(options={"workload": uri})
        groups = env.unwrapped.groups
        jobs = []
        for name in _names(c):
            found = groups.get(name, [])
            picks = sorted(random.Random(f"{c.seed}|{uri}|{name}").sample(range(len(found)),
                                                                           min(c.per_strategy, len(found))))
            for action in (found[i].text for i in picks):
                key = f"{prefix}|{action}"
                if key in self.keys:
                    self.result.skipped += 1
                    continue
                env.reset(options={"workload": uri})
                job = Job(key)
                self._step(env, job, key, action)
                jobs.append(job)
        return jobs

    def walk_job(self, env: Recorder, uri: str, walk: int) -> Job:
        c = self.config
        episode = f"{c.prefix(uri)}|walk{walk}"
        rng = random.Random(f"{c.seed}|{uri}|walk{walk}")
        env.reset(options={"workload": uri})
        job, path = Job(episode), []
        names = _names(c)
        for _ in range(c.steps):
            groups = env.unwrapped.groups
            usable = [n for n in names if groups.get(n)]
            if not usable:
                break
            name = rng.choice(usable)
            path.append(rng.choice(groups[name]).text)
            if not self._step(env, job, f"{episode}|" + " ; ".join(path), path[-1], len(path)):
                break
        return job

    # -- verifying and writing -------------------------------------------------------------------------
    def finish(self, jobs: list[Job], workload) -> None:
        """Verify the jobs' new steps (in parallel), then write them in order: each walk up to its first
        failure, which is written as rejected."""
        todo = [(job, record) for job in jobs for record in job.records if record["verify"] is None]
        programs = [_after_program(record) for _, record in todo]
        reports = check_many([(p, workload) for p in programs], self.config.target, self.protocol, self.config.workers)
        for (_, record), report in zip(todo, reports):
            record["verify"] = report
        for job in jobs:
            for record in job.records:
                if not record["verify"].get("equivalent"):
                    reason = f"not equivalent: {record['verify'].get('reason')}"
                    job.rejected = self._rejection(record["key"], record, reason)
                    break
                self.writer.write(record)
                self.keys[record["key"]] = "step"
                self.result.written += 1
            if job.rejected is not None:
                if _transient(job.rejected["reason"]):
                    job.rejected["transient"] = True  # kept as a record, not as a verdict: a rerun tries it again
                    self.retry = True
                self.writer.write(job.rejected)
                _remember(self.keys, job.rejected)
                self.result.rejected += 1

    def run_workload(self, uri: str) -> bool:
        """Generate one workload's work; False when the time limit cut it short."""
        env = self.env(uri)
        try:
            env.reset(options={"workload": uri})
        except Exception as exc:  # noqa: BLE001  (a workload that does not convert or run is reported, not fatal)
            self.writer.write({"kind": "rejected", "key": f"{self.config.prefix(uri)}|*", "workload": uri,
                               "strategy": None, "action": None, "reason": f"{type(exc).__name__}: {exc}"})
            self.writer.write({"kind": "done", "key": self.config.prefix(uri)})
            return True
        workload = env.unwrapped.workload
        chunk = 4 * self.config.workers
        if self.config.steps == 1:
            jobs = self.one_step_jobs(env, uri)
            batches = [jobs[i:i + chunk] for i in range(0, len(jobs), chunk)]
        else:
            batches = [[self.walk_job(env, uri, w)] for w in range(self.config.walks)]
        self.retry = False
        for batch in batches:
            if self.expired():
                return False
            self.finish(batch, workload)
        if not self.retry:  # a workload with work to try again is not done: a rerun plans it again
            self.writer.write({"kind": "done", "key": self.config.prefix(uri)})
        return True


TRANSIENT = ("timed out", "crashed: the worker process died")
"""Verification failures that say more about the machine at the time (load, memory) than about the program:
written with `transient: true`, so a resumed run tries the step again instead of skipping it."""


def _transient(reason: str) -> bool:
    return any(marker in reason for marker in TRANSIENT)


def _after_program(record: dict[str, Any]):
    from ..ir.program import Program

    return Program.parse(record["after"]["leir"], record["after"]["signature"])


def generate(config: GenerateConfig, out: Path | str, time_limit: float | None = None,
             progress: Callable[[str, GenerateResult], None] | None = None, ray: str | None = None,
             actors: int = 2) -> GenerateResult:
    """Generate into `out` (see the module docstring); stops between batches once `time_limit` seconds
    have passed. `progress(uri, result)` is called after each workload. With `ray` ("local" or a cluster
    address), workloads go to `actors` Ray actors instead (`generate_ray`)."""
    if ray is not None:
        from .generate_ray import generate_ray

        return generate_ray(config, out, ray, actors, time_limit, progress)
    out = Path(out)
    start = time.monotonic()
    gen = _Generator(config, out, None if time_limit is None else start + time_limit)
    try:
        for uri in config.workloads:
            if config.prefix(uri) in gen.finished:
                gen.result.workloads_done += 1
                continue
            if gen.expired() or not gen.run_workload(uri):
                gen.result.stopped_early = True
                break
            gen.result.workloads_done += 1
            if progress is not None:
                progress(uri, gen.result)
    finally:
        gen.writer.close()
        gen.store.close()
    gen.result.elapsed_s = time.monotonic() - start
    _count(gen.path, gen.result)
    return gen.result


def _count(path: Path, result: GenerateResult) -> None:
    for record in read_records(path):
        if record["kind"] == "step":
            result.rows_by_strategy[record["strategy"]] += 1
            result.rows_by_workload[record["workload"]] += 1
        elif record["kind"] == "rejected":
            result.rejected_by_strategy[record.get("strategy") or "(workload)"] += 1
