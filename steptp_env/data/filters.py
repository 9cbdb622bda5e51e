"""Which recorded steps become dataset rows: quality filters and caps for balance.

In the spirit of Step-TP's strategy filtering, but on verified facts: a step is dropped when it failed,
was not verified or failed verification, changes nothing (no-op) or only fresh names (cosmetic), returns
to a program its episode already had (undoing an earlier step, like a fusion right after the fission it
reverses), or repeats a transition already kept. One-step rows also need a step measured faster: both
runtimes measured (or stored measurements), before/after above `min_speedup`, so that a prompt asking for a
transformation "that you expect to make it faster" is not answered with a recorded slowdown or a guess;
`best_per_program` keeps only a program's fastest steps, so that rows teach which transformation to choose
among those that help, not that any of them will do. Caps then bound the rows per strategy and per
workload, keeping a seeded random subset so that no strategy or workload dominates. Every drop is counted
with its reason in a `FilterReport`.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..ir.program import Program
from ..strategies import canonical_text

Steps = list[dict[str, Any]]
"""Step records of a trajectory file (see `records.py`)."""

REASONS = ("error", "stop", "free-form", "not verified", "verification failed", "no-op", "cosmetic", "undo",
           "not measured faster", "duplicate", "not among the fastest", "after a dropped step", "strategy cap",
           "workload cap")
"""Drop reasons, in the order the filters run."""


@dataclass(frozen=True)
class FilterConfig:
    """What to drop. Caps of None mean no cap; `seed` picks which rows a cap keeps. `min_speedup` (None: off)
    applies to one-step rows (`filter_steps`); an episode's conversation reports every step's runtime in its
    feedback turns, slowdowns included, so `filter_episodes` does not cut at one. `best_per_program` (None:
    off) keeps, of the one-step rows from one program, the ones with the highest speedups."""

    require_verified: bool = True
    drop_noop: bool = True
    drop_cosmetic: bool = True
    drop_undo: bool = True
    drop_duplicates: bool = True
    max_per_strategy: int | None = None
    max_per_workload: int | None = None
    min_speedup: float | None = 1.0
    best_per_program: int | None = None
    seed: int = 0


@dataclass
class FilterReport:
    """Steps in and kept, and the drops by reason (overall and per strategy)."""

    config: FilterConfig
    total: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    by_strategy: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def drop(self, step: dict[str, Any], reason: str) -> None:
        self.dropped[reason] += 1
        self.by_strategy[step.get("strategy") or "(none)"][reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "total": self.total, "kept": self.kept,
                "dropped": {r: self.dropped[r] for r in REASONS if self.dropped[r]},
                "dropped_by_strategy": {s: {r: c[r] for r in REASONS if c[r]}
                                        for s, c in sorted(self.by_strategy.items())}}


def step_id(step: dict[str, Any]) -> str:
    """A content id of a transition: the same workload, program and action give the same id in any run."""
    text = "\n".join(str(step.get(k)) for k in ("workload", "preset", "dtype", "target", "action"))
    return hashlib.sha256((text + "\n" + step["before"]["leir"]).encode()).hexdigest()[:16]


MEASURED = ("measured", "stored")
"""Runtime sources that are timings on the machine (a stored one was measured earlier)."""


def speedup(step: dict[str, Any]) -> float | None:
    """before/after of a step with two finite runtimes (measured or predicted), else None."""
    before, after = step.get("runtime_before_s"), step.get("runtime_after_s")
    if not before or not after or not math.isfinite(before) or not math.isfinite(after):
        return None
    return before / after


def measured_speedup(step: dict[str, Any]) -> float | None:
    """`speedup` of a step whose two runtimes were both measured, else None."""
    if step.get("source_before") not in MEASURED or step.get("source_after") not in MEASURED:
        return None
    return speedup(step)


def program_key(step: dict[str, Any]) -> tuple:
    """The program a step starts from: steps with the same key are alternatives for one prompt."""
    return step["workload"], step.get("preset"), step.get("dtype"), step["before"]["leir"]


def episode_key(step: dict[str, Any]) -> tuple[str, str]:
    return step.get("source") or "", str(step.get("episode"))


def _canonical(part: dict[str, Any]) -> str:
    return canonical_text(Program.parse(part["leir"], part["signature"], validate=False))


def _quality(step: dict[str, Any], config: FilterConfig) -> str | None:
    """The reason a step cannot be a row on its own (None when it can)."""
    if step.get("error"):
        return "error"
    if step.get("after") is None:
        return "stop"
    if not step.get("strategy"):
        return "free-form"
    report = step.get("verify")
    if report is None and config.require_verified:
        return "not verified"
    if report is not None and not report.get("equivalent"):
        return "verification failed"
    if step["after"]["leir"] == step["before"]["leir"] and config.drop_noop:
        return "no-op"
    return None


def _episodes(steps: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The recorded episodes in step order; a search's record (steps that name their `parent`, `steptp
    run`) is a tree, read as its paths from the start to each leaf (shared steps appear in several)."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for step in steps:
        grouped[episode_key(step)].append(step)
    episodes = []
    for key in sorted(grouped):
        ordered = sorted(grouped[key], key=lambda s: s.get("step") or 0)
        episodes += _paths(ordered) if any("parent" in s for s in ordered) else [ordered]
    return episodes


def _paths(tree: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Start-to-leaf paths of a search tree whose steps name their parent's `step` (0: the start)."""
    by_number = {s["step"]: s for s in tree}
    parents = {s.get("parent") for s in tree}
    paths = []
    for leaf in (s for s in tree if s["step"] not in parents):
        path, step = [], leaf
        while step is not None:
            path.append(step)
            step = by_number.get(step.get("parent"))
        paths.append(path[::-1])
    return paths


def _walk(episode: list[dict[str, Any]], config: FilterConfig, report: FilterReport, truncate: bool,
          verdicts: dict[int, str | None]) -> list[dict[str, Any]]:
    """The steps of one episode that pass the quality filters; with `truncate`, none after the first
    dropped transformation (later states depend on it). `verdicts` holds each step's verdict (None: kept)
    by `id`, so a step shared by several paths of a search tree is judged and counted once (its ancestors,
    which decide an undo, are the same on every path)."""
    kept, seen, stopped = [], set(), False
    for step in episode:
        moved = step.get("after") is not None and not step.get("error")
        if moved and (config.drop_cosmetic or config.drop_undo):
            before, after = _canonical(step["before"]), _canonical(step["after"])
            seen.add(before)
        if id(step) not in verdicts:
            reason = "after a dropped step" if stopped else _quality(step, config)
            if moved and reason is None and config.drop_cosmetic and before == after:
                reason = "cosmetic"
            elif moved and reason is None and config.drop_undo and after in seen:
                reason = "undo"
            verdicts[id(step)] = reason
            if reason is not None:
                report.drop(step, reason)
        if moved and (config.drop_cosmetic or config.drop_undo):
            seen.add(after)
        if verdicts[id(step)] is None:
            kept.append(step)
        else:
            stopped = stopped or (truncate and moved)
    return kept


def _maximal(episodes: list[Steps]) -> list[Steps]:
    """The episodes that are no prefix of another (nor a repeat): the kept part of a search-tree path
    that ended in failed or dropped steps is a prefix of a longer path's."""
    keys = [tuple(map(id, episode)) for episode in episodes]
    prefixes = {key[:n] for key in keys for n in range(1, len(key))}
    unique = {key: episode for key, episode in zip(keys, episodes) if key not in prefixes}
    return list(unique.values())


def _rank(config: FilterConfig, step: dict[str, Any]) -> str:
    return hashlib.sha256(f"{config.seed}:{step_id(step)}".encode()).hexdigest()


def _cap(steps: list[dict[str, Any]], limit: int | None, group, reason: str, config: FilterConfig,
         report: FilterReport, first=None) -> list[dict[str, Any]]:
    """At most `limit` steps of each `group`: the first by `first` (a sort key of a step), ties and the
    rest in the seeded order."""
    if limit is None:
        return steps
    chosen: set[int] = set()
    members: dict[str, list[int]] = defaultdict(list)
    for i, step in enumerate(steps):
        members[group(step)].append(i)
    order = first or (lambda step: 0)
    for indices in members.values():
        chosen.update(sorted(indices, key=lambda i: (order(steps[i]), _rank(config, steps[i])))[:limit])
    for i, step in enumerate(steps):
        if i not in chosen:
            report.drop(step, reason)
    return [s for i, s in enumerate(steps) if i in chosen]


def filter_steps(steps: Steps, config: FilterConfig = FilterConfig()) -> tuple[Steps, FilterReport]:
    """Steps that may each become a one-step row, in a deterministic order, and the report."""
    report, verdicts = FilterReport(config, total=len(steps)), {}
    kept = list({id(s): s for episode in _episodes(steps)
                 for s in _walk(episode, config, report, False, verdicts)}.values())
    kept.sort(key=lambda s: (s["workload"], step_id(s)))
    if config.min_speedup is not None:
        faster = []
        for step in kept:
            ratio = measured_speedup(step)
            if ratio is None or ratio <= config.min_speedup:
                report.drop(step, "not measured faster")
            else:
                faster.append(step)
        kept = faster
    if config.drop_duplicates:
        unique, seen = [], set()
        for step in kept:
            key = (*program_key(step), _canonical(step["after"]))
            if key in seen:
                report.drop(step, "duplicate")
            else:
                seen.add(key)
                unique.append(step)
        kept = unique
    kept = _cap(kept, config.best_per_program, program_key, "not among the fastest", config, report,
                first=lambda s: -(speedup(s) or 0.0))
    kept = _cap(kept, config.max_per_strategy, lambda s: s["strategy"], "strategy cap", config, report)
    kept = _cap(kept, config.max_per_workload, lambda s: s["workload"], "workload cap", config, report)
    report.kept = len(kept)
    return kept, report


def filter_episodes(steps: Steps, config: FilterConfig = FilterConfig()) -> tuple[list[Steps], FilterReport]:
    """Episodes cut at their first dropped transformation (failed attempts in between are skipped, not
    cut at), empty ones removed; `max_per_workload` caps episodes, not steps. Strategy caps do not apply."""
    report, verdicts = FilterReport(config, total=len(steps)), {}
    episodes = _maximal([kept for episode in _episodes(steps)
                         if (kept := _walk(episode, config, report, True, verdicts))])
    if config.max_per_workload is not None:
        by_workload: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
        for episode in episodes:
            by_workload[episode[0]["workload"]].append(episode)
        episodes = []
        for uri in sorted(by_workload):
            ranked = sorted(by_workload[uri], key=lambda e: _rank(config, e[0]))
            chosen = {id(step) for episode in ranked[:config.max_per_workload] for step in episode}
            capped = {id(step): step for episode in ranked[config.max_per_workload:] for step in episode}
            for key, step in capped.items():
                if key not in chosen:
                    report.drop(step, "workload cap")
            episodes += ranked[:config.max_per_workload]
    episodes.sort(key=lambda e: (e[0]["workload"], step_id(e[0]), len(e)))
    report.kept = len({id(step) for episode in episodes for step in episode})
    return episodes, report
