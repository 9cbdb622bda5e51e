"""The trajectory file: JSON lines, one record a line, appended and synced line by line.

A crash can only cut the line being written: `JsonlWriter` drops such a tail when it reopens the file and
`read_records` ignores it, so a killed run loses at most its step in flight and never corrupts the rest.

Records (`kind`):
- `header`: first line of a file. `format` ("steptp-trajectory"), `version`, `config` (what produced the
  file: env or generator settings), `versions` (steptp_env, tvm, torch, numpy).
- `reset`: an episode starts. `episode` (id, a string), `workload`, `preset`, `dtype`, `target`, `mode`,
  `leir`, `signature`, `runtime_s`, `runtime_source`, `obs` (the numeric features, or null), `legal` (the
  catalog indices the action mask allows, or null).
- `step`: one env step. `episode`, `step` (1-based number of the attempt in its episode; failed attempts
  count), `key` (generator work key or null), `workload`,
  `preset`, `dtype`, `target`, `action` (action text, or `leir:` + a free-form program), `index` (catalog
  index or null), `strategy`, `before` and `after` (`{"leir", "signature"}`; `after` null when the step
  failed), `explain`, `verify` (the report as a dict, or null when not verified), `runtime_before_s`,
  `runtime_after_s`, `source_before`, `source_after` (`measured`, `stored` or `predicted`), `reward`,
  `error`, `terminated`, `truncated`, `obs_before`, `obs_after` (null after a failed step), `legal_before`,
  `legal_after`. A search's steps (`steptp run`) also name their `parent` (the `step` they started from;
  0: the start), `depth` and the budget `spent`: the episode is a tree.
- `rejected`: a generator's work item that produced no row (`key`, `workload`, `strategy`, `action`,
  `reason`), kept so a restart skips it.
- `done`: a generator finished all work of a workload (`key`: workload, preset, dtype, target).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

FORMAT = "steptp-trajectory"
VERSION = 1


def dumps(record: dict[str, Any]) -> str:
    """The one line a record is stored as (keys in insertion order, so a record reads as written)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


class JsonlWriter:
    """Appends records to a JSON-lines file, each flushed and fsynced before `write` returns."""

    def __init__(self, path: Path | str, header: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_tail(self.path)
        self._file = open(self.path, "ab")
        if header is not None and self._file.tell() == 0:
            self.write({"kind": "header", "format": FORMAT, "version": VERSION, **header})

    def write(self, record: dict[str, Any]) -> None:
        self._file.write((dumps(record) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_partial_tail(path: Path) -> None:
    """Cut a last line without its newline (a write interrupted by a crash)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_records(path: Path | str) -> Iterator[dict[str, Any]]:
    """The complete records of a file in order (an unterminated last line is skipped). A malformed
    complete line is an error: it cannot come from a crash."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON record: {exc}") from None


def trajectory_files(paths: Iterable[Path | str]) -> list[Path]:
    """Files named directly, plus every *.jsonl under named folders, sorted (so exports do not depend
    on the order arguments are given in)."""
    found: set[Path] = set()
    for path in map(Path, paths):
        found.update(path.rglob("*.jsonl") if path.is_dir() else [path])
    return sorted(found)


def load_steps(paths: Iterable[Path | str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(headers, step records) of trajectory files. Each record gets `source` (folder and file name) so
    that episode ids stay distinct across files. A file that is not a trajectory file (its first line is
    not a `header` of this format), and a folder without any, is a `ValueError` naming it: an export of
    nothing is never a silent success."""
    headers, steps = [], []
    paths = list(paths)
    files = trajectory_files(paths)
    if not files:
        raise ValueError(f"no .jsonl files in {', '.join(map(str, paths))}: expected trajectory files "
                         "(Recorder, steptp generate's steps.jsonl, steptp run's trajectory.jsonl)")
    for path in files:
        source = f"{path.parent.name}/{path.name}"
        for number, record in enumerate(read_records(path)):
            if number == 0 and not (record.get("kind") == "header" and record.get("format") == FORMAT):
                raise ValueError(f"{path} is not a trajectory file: its first line should be a header with "
                                 f'"format": "{FORMAT}" (written by Recorder, steptp generate and steptp run; '
                                 "a run folder from before 0.4 holds the search log instead)")
            if record.get("kind") == "header":
                headers.append(dict(record, source=source))
            elif record.get("kind") == "step":
                steps.append(dict(record, source=source))
    return headers, steps
