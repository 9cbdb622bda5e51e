"""Training data for the cost model: measured programs of the suite, reached by random action sequences,
kept in the result store with their features."""
from __future__ import annotations

import json
import random
import time
from typing import Callable, Iterable

import numpy as np

from ..frontend.workload import Workload
from ..ir.program import Program
from ..measure import Protocol, ResultStore, measure, record_key
from ..measure.context import context
from ..strategies import REGISTRY, STRATEGY_NAMES, apply_action
from ..workloads import get_workload, spec
from .features import FEATURE_VERSION, Features, features
from .model import CostModel


def random_step(program: Program, rng: random.Random) -> Program | None:
    """One random action: a strategy drawn uniformly among those with a candidate here, then one of its
    candidates, so every strategy is as likely as any other (uniform over all candidates would mostly
    reorder and tile, which offer the most), and only the strategies tried are enumerated; None where no
    strategy applies."""
    names = [name for name in STRATEGY_NAMES if name in REGISTRY]
    rng.shuffle(names)
    for name in names:
        found = REGISTRY[name].candidates(program, "llvm")
        if found:
            return apply_action(program, rng.choice(found))
    return None


def random_programs(program: Program, count: int, max_steps: int, seed: int) -> list[Program]:
    """`count` distinct programs reached from `program` by seeded random walks of 1 to `max_steps` actions
    (`random_step`), the start program first."""
    rng = random.Random(seed)
    found = {program.leir: program}
    attempts = 0
    while len(found) < count and attempts < count * 4:
        attempts += 1
        current = program
        for _ in range(rng.randint(1, max_steps)):
            following = random_step(current, rng)
            if following is None:
                break
            current = following
        found.setdefault(current.leir, current)
    return list(found.values())[:count]


def collect(store: ResultStore, uris: Iterable[str], per_workload: int, preset: str = "small", seed: int = 0,
            protocol: Protocol | None = None, max_steps: int = 6,
            progress: Callable[[str, int], None] | None = None, deadline: float | None = None) -> int:
    """Measure `per_workload` programs of each workload into `store` (skipping ones already there, so a
    stopped collection goes on where it was); returns how many new records were written. Stops before the
    next program once `time.time()` passes `deadline`."""
    protocol = protocol or Protocol()
    written = 0
    for uri in uris:
        wl = get_workload(uri, preset=preset)
        store.add_workload(uri, wl.program, preset)
        for program in random_programs(wl.program, per_workload, max_steps, seed):
            if deadline is not None and time.time() > deadline:
                return written
            if measure_into(store, uri, program, wl, protocol):
                written += 1
                if progress:
                    progress(uri, written)
    return written


def measure_into(store: ResultStore, uri: str, program: Program, workload: Workload, protocol: Protocol) -> bool:
    """Measure `program` of `workload` (stored under `uri`, which `add_workload` should know) into `store`
    with its features, unless a record of it under this protocol is there already; whether it measured."""
    where = context(workload)
    key = record_key(program, "llvm", protocol.key, where)
    if store.get(key) is not None:
        return False
    m = measure(program, workload, "llvm", protocol)
    store.put(key, m.to_dict(), uri, features(program).to_json() if m.ok else None, where)
    return True


def latest_records(store: ResultStore, uris: Iterable[str] | None = None) -> list[dict]:
    """The store's successful records of known workloads (of `uris`), one per (workload, program, target,
    protocol): the latest, so a program timed again under another measurement context (newer code, an
    imported collection) counts once; in the order the store first met each."""
    wanted = None if uris is None else set(uris)
    latest: dict[tuple, dict] = {}
    for record in store.records(ok_only=True):
        uri, m = record["workload"], record["measurement"]
        if uri is not None and (wanted is None or uri in wanted):
            latest[uri, m["leir"], m["target"], json.dumps(m["protocol"], sort_keys=True)] = record
    return list(latest.values())


def load_dataset(store: ResultStore, uris: Iterable[str] | None = None) -> tuple[list[Features], np.ndarray,
                                                                                 list[str]]:
    """(each program's features, runtimes in seconds, workload per program) of the store's
    successful records; missing features, or features of another version, are computed again
    (`record_features`; records of an unknown workload are left out). A program timed again under another
    measurement context (newer code, an imported collection) counts once, with its latest timing
    (`latest_records`)."""
    found_features, y, groups = [], [], []
    for record in latest_records(store, uris):
        uri = record["workload"]
        found = record_features(store, record)
        if found is None:
            continue
        found_features.append(found)
        y.append(record["measurement"]["median_s"])
        groups.append(uri)
    return found_features, np.asarray(y, np.float64), groups


def record_features(store: ResultStore, record: dict) -> Features | None:
    """A store record's cost-model features: as stored, or computed again from its program and its
    workload's stored signature where they are of another feature version or were left out of an export
    (`ResultStore.export(features=False)`); None for a record of a workload the store does not know."""
    found = Features.from_json(record["features"])
    if found is not None:
        return found
    signature = store.signature(record["workload"]) if record["workload"] is not None else None
    if signature is None:
        return None
    return features(Program.parse(record["measurement"]["leir"], signature), record["measurement"]["target"])


def split_workloads(uris: list[str], test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Hold whole workloads out: (train, test) URIs, seeded."""
    shuffled = sorted(uris)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, round(len(shuffled) * test_fraction))
    return sorted(shuffled[cut:]), sorted(shuffled[:cut])


def split_families(uris: list[str], test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Hold whole workload families out (`WorkloadSpec.family`: every matmul, every softmax, ...), so no
    held-out program has a sibling of the same operator in training: (train, test) URIs, seeded."""
    family = {uri: spec(uri).family for uri in uris}
    held = set(split_workloads(sorted(set(family.values())), test_fraction, seed)[1])
    return sorted(u for u in uris if family[u] not in held), sorted(u for u in uris if family[u] in held)


def train(store: ResultStore, uris: Iterable[str] | None = None, members: int = 5, seed: int = 0) -> CostModel:
    """A model of the store's successful records (of `uris`), with the protocol they were timed under in its
    metadata (the environment refuses a model for another thread count). A store whose records were timed
    under several protocols is refused: their runtimes are not one quantity."""
    uris = None if uris is None else list(uris)
    wanted = None if uris is None else set(uris)
    protocols = {Protocol(**r["measurement"]["protocol"]).key for r in store.records(ok_only=True)
                 if r["workload"] is not None and (wanted is None or r["workload"] in wanted)}
    if len(protocols) > 1:
        raise ValueError(f"the store {store.path} holds timings of {len(protocols)} protocols "
                         f"({', '.join(sorted(protocols))}); train on a store of one")
    programs, y, groups = load_dataset(store, uris)
    if len(y) < 2:
        raise ValueError(f"the store {store.path} has {len(y)} usable records; measure some first")
    model = CostModel(members=members, seed=seed).fit([p.rows for p in programs], y, groups)
    model.meta.update(workloads=len(set(groups)), feature_version=FEATURE_VERSION, protocol=protocols.pop(),
                      trained_on=f"{len(y)} measured programs of {len(set(groups))} workloads")
    return model
