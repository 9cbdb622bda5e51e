"""Where a step's runtime comes from: the result store, a measurement, or the cost model.

`measure` always measures (store hits excepted: the same lowered module under the same protocol is the
same record); `model` predicts with the cost model, deterministic and without building; `hybrid` predicts
and measures when the ensemble is unsure (spread above `spread_limit`, in log space) or when the
prediction claims a new best, so the best program of an episode is always a measured, verified one.
Measured runtimes feed the model online (it retrains as the data grows by ~20%).
"""
from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..costmodel import CostModel, Features, features
from ..measure import Measurement, PairedTiming, Protocol, ResultStore, measure, measure_pair, record_key
from ..measure.context import context
from ..ir.program import Program

MODES = ("measure", "model", "hybrid")


@dataclass
class Estimate:
    """A runtime and how it was obtained (`measured`, `stored`, `predicted`), or why there is none."""

    runtime_s: float | None
    source: str
    spread: float = 0.0
    predicted_s: float | None = None  # the model's raw prediction, where one was made
    measurement: Measurement | None = None
    error: str | None = None

    @property
    def measured(self) -> bool:
        return self.source in ("measured", "stored")


class RuntimeOracle:
    """Runtimes for the programs of one workload, in one of the three modes, with an in-memory cache in
    front of the store. `fork`ed environments share it (and so the store and the model)."""

    def __init__(self, mode: str, target: str, protocol: Protocol, store: ResultStore | None,
                 model: CostModel | None, spread_limit: float = 0.3, cache_size: int = 4096,
                 fresh: bool = False, remote: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "measure" and model is None:
            raise ValueError(f"mode {mode!r} needs a cost model")
        self.mode, self.target, self.protocol = mode, target, protocol
        self.store, self.model, self.spread_limit = store, model, spread_limit
        self._features: OrderedDict[str, Features] = OrderedDict()
        self._measured: OrderedDict[tuple[str, str], Estimate] = OrderedDict()
        self._paired: OrderedDict[tuple[str, str, str], PairedTiming] = OrderedDict()
        self._cache_size = cache_size
        self.counts = {"measured": 0, "stored": 0, "predicted": 0, "paired": 0, "stored pairs": 0}
        self._forced: bool | None = None
        self.fresh = fresh  # time every program (and pair) again rather than serve the store's timing
        self.remote = remote  # rpc://host:port/key: measurements run on a device of that tracker's farm

    @contextlib.contextmanager
    def forcing(self, measure: bool) -> Iterator[None]:
        """Hybrid mode: inside the block every runtime is measured (`measure=True`) or predicted (False),
        whatever the ensemble's spread and the episode's best. A search uses it to play a known chain of
        actions whole: its middle steps predicted (they cost no budget and, verified, still pay a reward
        on a checked program), its end measured (the only result it may keep). A runtime measured before
        is returned as measured either way. No effect in the other modes."""
        saved, self._forced = self._forced, measure
        try:
            yield
        finally:
            self._forced = saved

    def features(self, program: Program) -> Features:
        """Cost-model rows and observation vector of a program (cached by its text)."""
        found = self._features.get(program.leir)
        if found is None:
            found = features(program, self.target)
            self._remember(self._features, program.leir, found)
        return found

    def _remember(self, cache: OrderedDict, key, value) -> None:
        cache[key] = value
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    def predict(self, program: Program) -> Estimate:
        runtime, spread = self.model.predict([self.features(program).rows])
        self.counts["predicted"] += 1
        return Estimate(float(runtime[0]), "predicted", float(spread[0]), float(runtime[0]))

    def measure(self, program: Program, workload, beside: Callable[[], Any] | None = None) -> Estimate:
        """A measured runtime: from this oracle's memory, the store, or a fresh measurement (stored). While
        a fresh measurement's kernel builds in the worker, this process extracts the program's features
        (which the store and the model take with the runtime) and runs `beside` (the caller's own work on
        the program, `measure.measure`)."""
        memo = (workload.uri, program.leir)
        if memo in self._measured:
            return self._measured[memo]
        record = key = None
        where = context(workload) + (f"|remote={self.remote}" if self.remote else "")
        if self.store is not None and not self.fresh:
            record = self.store.find(workload.uri, program.leir, self.target, self.protocol.key, where)
            if record is None:
                key = record_key(program, self.target, self.protocol.key, where)
                record = self.store.get(key)
        if record is not None:
            data = record["measurement"]
            self.counts["stored"] += 1
            estimate = Estimate(data.get("median_s"), "stored", error=data.get("error"))
            stored = Features.from_json(record.get("features"))
            if stored is not None:
                self._remember(self._features, program.leir, stored)
                if self.model is not None and estimate.error is None:
                    self.model.update([stored.rows], [estimate.runtime_s], [record["key"]], [workload.uri])
        else:
            def meanwhile() -> None:
                self.features(program)
                if beside is not None:
                    beside()

            m = measure(program, workload, self.target, self.protocol, remote=self.remote, beside=meanwhile)
            self.counts["measured"] += 1
            feats = self.features(program) if m.ok else None
            key = key or record_key(program, self.target, self.protocol.key, where)
            if self.store is not None:
                self.store.put(key, m.to_dict(), workload.uri, None if feats is None else feats.to_json(), where)
            if m.ok and self.model is not None:
                self.model.update([feats.rows], [m.median_s], [key], [workload.uri])
            estimate = Estimate(m.median_s, "measured", measurement=m, error=m.error)
        self._remember(self._measured, memo, estimate)
        return estimate

    def pair(self, before: Program, after: Program, workload) -> PairedTiming:
        """The speedup of `after` over `before`, timed interleaved in one worker run (`measure.paired`),
        kept in memory and in the store under both programs, the target, the protocol and the measurement
        context: a replay, a fork or a tree search that meets the same pair pays nothing for it again."""
        memo = (workload.uri, before.leir, after.leir)
        found = self._paired.get(memo)
        if found is not None:
            return found
        text = "\0".join((*memo, self.target, self.protocol.key, context(workload)))
        key = hashlib.sha256(text.encode()).hexdigest()[:32]
        stored = self.store.get_pair(key) if self.store is not None and not self.fresh else None
        if stored is not None:
            found = PairedTiming.from_dict(stored)
            self.counts["stored pairs"] += 1
        else:
            found = measure_pair(before, after, workload, self.target, self.protocol)
            self.counts["paired"] += 1
            if found.error is None and self.store is not None:
                self.store.put_pair(key, found.to_dict())
        if found.error is None:
            self._remember(self._paired, memo, found)
        return found

    def runtime(self, program: Program, workload, best_s: float | None = None, scale: float = 1.0,
                beside: Callable[[], Any] | None = None) -> Estimate:
        """The runtime of `program` in this oracle's mode. `best_s` is the best runtime of the episode so
        far (a hybrid prediction below it is checked by measuring); `scale` calibrates hybrid predictions
        to this episode's measurements (measured / predicted at the last measured program), so rewards
        compare like with like. `beside` runs while a fresh measurement builds (see `measure`)."""
        if self.mode == "measure":
            return self.measure(program, workload, beside)
        memo = self._measured.get((workload.uri, program.leir))
        if memo is not None and self.mode == "hybrid":
            return memo
        estimate = self.predict(program)
        if self.mode == "model":
            return estimate
        estimate.runtime_s *= scale
        if self._forced is False:
            return estimate
        claims_best = best_s is not None and estimate.runtime_s < best_s
        if self._forced or estimate.spread > self.spread_limit or claims_best:
            measured = self.measure(program, workload, beside)
            measured.predicted_s = estimate.predicted_s
            return measured
        return estimate
