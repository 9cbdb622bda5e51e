"""The measured programs of a result store as a Hugging Face dataset (parquet plus a card), and back.

One row per successfully measured program: its LEIR text, the workload (URI, preset and signature), the
cost-model features (`Features.to_json`: rows as compressed float32 bytes, the observation vector), the runtime
(median) with every repeated timing, the protocol, the load average it was timed at, the machine and the
code versions. The store is a cache that stays out of git; the export is what a cost-model result is
reproduced from (`load_exported` gives what `dataset.load_dataset` gives from a store).
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np

from ..measure import ResultStore
from ..measure.context import machine_description
from .dataset import record_features
from .features import FEATURE_VERSION, Features

CARD = """---
license: apache-2.0
tags: [tensor-compilers, cost-model, tvm, leir]
---
# steptp_env measured programs

{programs} LEIR programs of {workloads} steptp_env suite workloads (preset {presets}), each built with TVM
{tvm} (LLVM {llvm}), checked against the workload's PyTorch reference and timed under the protocol
`{protocol}` on {machine} (fingerprint `{fingerprint}`). Programs are the workloads' start programs
and programs reached from them by seeded random sequences of the environment's actions
(`steptp_env.costmodel.dataset.collect`), with whatever programs a benchmark measured into the same store
(e.g. those a PPO policy visited, `benchmarks/ppo_model_mode.py --rounds`).

Columns: `program` (LEIR text), `workload` (suite URI), `preset` (the workload's sizes), `signature` (JSON),
`runtime_s` (median of the timings), `timings_s`, `protocol`, `load_average` (1, 5, 15 min, when the
program was timed), `machine`, `versions` (JSON), `features` (JSON of
`steptp_env.costmodel.Features.to_json`, feature version {feature_version}).

Programs per workload: {per_workload}.

Runtimes hold on this machine and protocol only; ranks within a workload are what transfers. Load a
copy with `steptp_env.costmodel.export.load_exported(PATH)`.
"""


def export_dataset(store: ResultStore, directory: Path | str) -> int:
    """Write `directory/data.parquet` and `directory/README.md` (the card); returns the row count. Features
    missing or of another version are computed again (`dataset.record_features`); records of a workload
    the store does not know are left out."""
    import datasets

    directory = Path(directory)
    columns: dict[str, list] = collections.defaultdict(list)
    signatures: dict[str, str | None] = {}
    presets: dict[str, str] = {}
    for record in store.records(ok_only=True):
        uri, m = record["workload"], record["measurement"]
        if uri not in signatures:
            found = store.signature(uri) if uri is not None else None
            signatures[uri] = None if found is None else json.dumps(found)
            presets[uri] = (store.preset(uri) if uri is not None else None) or ""
        found = None if signatures[uri] is None else record_features(store, record)
        if found is None:
            continue
        for name, value in (("program", m["leir"]), ("workload", uri), ("preset", presets[uri]),
                            ("signature", signatures[uri]),
                            ("runtime_s", m["median_s"]), ("timings_s", m["timings"]),
                            ("protocol", json.dumps(m["protocol"], sort_keys=True)),
                            ("load_average", list(m["load_average"])),
                            ("machine", m["versions"].get("machine", "")),
                            ("versions", json.dumps(m["versions"], sort_keys=True)),
                            ("features", json.dumps(found.to_json()))):
            columns[name].append(value)
    count = len(columns["program"])
    if not count:
        raise ValueError(f"the store {store.path} has no measured programs with features to export")
    directory.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(dict(columns)).to_parquet(str(directory / "data.parquet"))
    versions = json.loads(columns["versions"][0])
    sizes = collections.Counter(columns["workload"])
    presets = ", ".join(f"`{p}`" for p in sorted(set(columns["preset"]) - {""})) or "unrecorded"
    per_workload = f"{min(sizes.values())} to {max(sizes.values())} (median {int(np.median(list(sizes.values())))})"
    (directory / "README.md").write_text(CARD.format(
        programs=count, workloads=len(sizes), tvm=versions.get("tvm"), llvm=versions.get("llvm"),
        presets=presets, protocol=columns["protocol"][0], machine=machine_description(),
        fingerprint=versions.get("machine"), feature_version=FEATURE_VERSION, per_workload=per_workload))
    return count


def load_exported(directory: Path | str) -> tuple[list[Features], np.ndarray, list[str]]:
    """(features, runtimes in seconds, workload per program) of an exported dataset: what
    `dataset.load_dataset` gives from the store it was exported from. A program timed again (another row of
    the same workload, program and protocol; rows are in the store's order) counts once, with its latest
    timing, as there."""
    import datasets

    table = datasets.Dataset.from_parquet(str(Path(directory) / "data.parquet"))
    latest: dict[tuple, int] = {}  # in the order programs first appear, as `load_dataset` orders them
    for row, key in enumerate(zip(table["workload"], table["program"], table["protocol"])):
        latest[key] = row
    rows = list(latest.values())
    features_text, runtimes, workloads = table["features"], table["runtime_s"], table["workload"]
    found = [Features.from_json(json.loads(features_text[row])) for row in rows]
    if any(f is None for f in found):
        raise ValueError(f"{directory} holds features of another version than v{FEATURE_VERSION}")
    return found, np.asarray([runtimes[row] for row in rows], np.float64), [workloads[row] for row in rows]
