"""An export folder: the rows as Hugging Face `datasets` JSONL and parquet, a dataset card, the filter report.

```
OUT/data/train.jsonl     one row a line (the columns are documented in `export.py`)
OUT/data/train.parquet   the same rows with an explicit schema (needs pyarrow, the `data` extra)
OUT/README.md            dataset card: schema, counts per strategy and workload, generation config
OUT/report.json          what the filters dropped and why, and the export options
```
Nothing in the folder depends on when or where it was written, so exporting the same trajectories twice
gives byte-identical files.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from .export import ExportOptions, chat_rows, trajectory_rows
from .filters import FilterConfig, FilterReport, filter_episodes, filter_steps
from .records import load_steps

COLUMNS = (("id", "string", "content hash of the row's transitions"),
           ("kind", "string", "steptp-chat, steptp-chat-grounded or trajectory"),
           ("style", "string", "ir (the answer is the whole program) or action (the answer is an action text)"),
           ("messages", "list of {role, content}", "the conversation: [system], user, assistant, ..."),
           ("workload", "string", "suite URI (or steptp-ref/<model> for imported rows)"),
           ("preset", "string or null", "shape preset of the workload"),
           ("dtype", "string", "element type of the workload"),
           ("target", "string", "llvm or cuda"),
           ("strategies", "list of string", "the applied strategy of each answer"),
           ("actions", "list of string", "the action text of each answer"),
           ("runtimes_before_s", "list of float or null", "runtime of the program before each answer"),
           ("runtimes_after_s", "list of float or null", "runtime of the program after each answer"),
           ("runtime_sources", "list of string or null", "measured (both runtimes timed on the machine) or "
                                                           "predicted (either from the cost model)"),
           ("speedups", "list of float or null", "before/after of each answer"))

KIND_TEXT = {
    "steptp-chat": "One user turn with a LEIR program and its tensors, one assistant turn with reasoning and "
                   "a verified transformation in Step-TP's answer format.",
    "steptp-chat-grounded": "Like steptp-chat, with reasoning that also states the runtimes before and after "
                            "(measured or predicted, labelled), the speedup and how the analysis counts change.",
    "trajectory": "A whole episode as a conversation: the program, then transformation, verification and "
                  "runtime feedback, next transformation, ..., stop.",
}


def _write(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def jsonl_bytes(rows: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([("id", pa.string()), ("kind", pa.string()), ("messages", pa.list_(message)),
                        ("workload", pa.string()), ("preset", pa.string()), ("dtype", pa.string()),
                        ("target", pa.string()), ("strategies", pa.list_(pa.string())),
                        ("actions", pa.list_(pa.string()))])
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    _write(path, buffer.getvalue())


def _table(title: str, counts: Counter) -> str:
    lines = [f"| {title} | rows |", "|---|---|"] + [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    return "\n".join(lines)


def _speed_text(options: ExportOptions, config: FilterConfig) -> str:
    if options.kind == "trajectory":
        return "Conversations report every step's runtime, slowdowns included."
    if config.min_speedup is None:
        return "Rows were not filtered by speed: a row's step may be slower, predicted or untimed (see `speedups`)."
    return (f"Each row's step was measured faster than x{config.min_speedup:g} (both runtimes timed on the machine; "
            "see `speedups`).")


def card(rows: list[dict[str, Any]], options: ExportOptions, report: FilterReport, headers: list[dict[str, Any]],
         parquet: bool) -> str:
    """The dataset card (README.md with the `datasets` YAML header)."""
    configs = {(json.dumps(h.get("config"), sort_keys=True), json.dumps(h.get("versions"), sort_keys=True))
               for h in headers}
    generation = [{"config": json.loads(c), "versions": json.loads(v)} for c, v in sorted(configs)]
    strategies = Counter(s for r in rows for s in r["strategies"])
    workloads = Counter(r["workload"] for r in rows)
    files = "  - split: train\n    path: data/train.jsonl\n"
    parquet_config = ("- config_name: parquet\n  data_files:\n  - split: train\n    path: data/train.parquet\n"
                      if parquet else "")
    schema = "\n".join(f"| `{name}` | {kind} | {text} |" for name, kind, text in COLUMNS)
    return (f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}{parquet_config}license: apache-2.0\n"
            "task_categories:\n- text-generation\ntags:\n- tensor-programs\n- compilers\n- leir\n---\n\n"
            f"# steptp_env rows: {options.kind}\n\n{KIND_TEXT[options.kind]}\n\n"
            f"{len(rows)} rows, {sum(strategies.values())} transformations, {len(workloads)} workloads. Every "
            "answer was verified numerically equivalent to the workload's reference before export "
            "(`steptp export --validate` checks it again). " + _speed_text(options, report.config) + "\n\n"
            f"## Schema\n\n| column | type | meaning |\n|---|---|---|\n{schema}\n\n"
            f"## Transformations per strategy\n\n{_table('strategy', strategies)}\n\n"
            f"## Rows per workload\n\n{_table('workload', workloads)}\n\n"
            "## Generation config\n\n```json\n" + json.dumps(generation, indent=1, sort_keys=True) + "\n```\n\n"
            "## Export options and filtering\n\n```json\n"
            + json.dumps({"options": asdict(options), "filter": report.to_dict()}, indent=1) + "\n```\n")


def export_dataset(inputs: Iterable[Path | str], out: Path | str, options: ExportOptions = ExportOptions(),
                   config: FilterConfig = FilterConfig(),
                   parquet: bool = True) -> tuple[list[dict[str, Any]], FilterReport]:
    """Read trajectory files (or folders of them), filter, build rows and write the export folder."""
    out = Path(out)
    headers, steps = load_steps(inputs)
    if options.kind == "trajectory":
        episodes, report = filter_episodes(steps, config)
        rows = trajectory_rows(episodes, options)
    else:
        kept, report = filter_steps(steps, config)
        rows = chat_rows(kept, options)
    _write(out / "data" / "train.jsonl", jsonl_bytes(rows))
    if parquet:
        write_parquet(rows, out / "data" / "train.parquet")
    _write(out / "README.md", card(rows, options, report, headers, parquet).encode())
    summary = {"rows": len(rows), "options": asdict(options), "filter": report.to_dict()}
    _write(out / "report.json", (json.dumps(summary, indent=1) + "\n").encode())
    return rows, report
