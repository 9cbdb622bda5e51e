"""`ResultStore`: measurements in one SQLite file, shared by processes, keyed by what was measured.

The key is a hash of the lowered module's structure plus the target, the protocol and the measurement
context (`measure.context`: code versions, machine, the workload's reference digest), so two programs that
lower to the same TIR share one record, and a record made by other code, on another machine or for another
workload is never reused. Records written before the context existed have none and are never found.
SQLite in WAL mode lets several processes read while one writes; each record is written in its own
transaction, so a writer killed mid-way leaves either the whole record or nothing. `export` and
`import_records` move a store's contents as JSON lines.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import IO, Any, Iterator

from ..ir.program import Program

SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    uri TEXT PRIMARY KEY, preset TEXT, leir TEXT NOT NULL, signature TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY, workload TEXT, leir TEXT NOT NULL, target TEXT NOT NULL, protocol TEXT NOT NULL,
    median_s REAL, error TEXT, measurement TEXT NOT NULL, features TEXT, created REAL NOT NULL, context TEXT);
CREATE INDEX IF NOT EXISTS records_by_workload ON records (workload);
CREATE INDEX IF NOT EXISTS records_by_program ON records (workload, leir);
CREATE TABLE IF NOT EXISTS candidates (key TEXT PRIMARY KEY, groups TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS pairs (key TEXT PRIMARY KEY, pair TEXT NOT NULL, created REAL NOT NULL);
"""


def default_path() -> Path:
    """$STEPTP_STORE, else the user's cache directory."""
    if os.environ.get("STEPTP_STORE"):
        return Path(os.environ["STEPTP_STORE"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "steptp_env" / "results.sqlite"


def record_key(program: Program, target: str, protocol_key: str, context: str = "") -> str:
    """Structural hash of the lowered module + target + protocol + measurement context."""
    import tvm_ffi

    from ..lower import lower

    structure = tvm_ffi.structural_hash(lower(program, target))
    return hashlib.sha256(f"{structure}|{target}|{protocol_key}|{context}".encode()).hexdigest()[:32]


def _open_text(path: Path | str, mode: str) -> IO[str]:
    """A text file, gzip-compressed where the name ends in .gz."""
    return gzip.open(path, mode + "t") if str(path).endswith(".gz") else open(path, mode)


def _protocol_key(protocol: dict[str, Any]) -> str:
    from .runner import Protocol

    return Protocol(**protocol).key


class ResultStore:
    """Measurements and workloads in one SQLite file (WAL); safe for concurrent processes."""

    def __init__(self, path: Path | str | None = None, timeout: float = 60.0) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(records)")}
        if "context" not in columns:  # a store from before the context: its records keep none
            with contextlib.suppress(sqlite3.OperationalError):  # another process added it meanwhile
                self._conn.execute("ALTER TABLE records ADD COLUMN context TEXT")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------------
    def add_workload(self, uri: str, program: Program, preset: str | None = None) -> None:
        with self._transaction():
            self._conn.execute("INSERT OR REPLACE INTO workloads VALUES (?, ?, ?, ?, ?)",
                               (uri, preset, program.leir, json.dumps(program.signature.to_json()), time.time()))

    def put(self, key: str, measurement: dict[str, Any], workload: str | None = None,
            features: Any = None, context: str | None = None) -> None:
        """Store one measurement (as produced by `Measurement.to_dict`) under `key`, made in `context`, with
        the program's cost-model features (any JSON value; the cost model owns the format)."""
        row = (key, workload, measurement["leir"], measurement["target"], json.dumps(measurement["protocol"],
               sort_keys=True), measurement.get("median_s"), measurement.get("error"),
               json.dumps(measurement, sort_keys=True), None if features is None else json.dumps(features),
               time.time(), context)
        with self._transaction():
            self._conn.execute("INSERT OR REPLACE INTO records (key, workload, leir, target, protocol, median_s, "
                               "error, measurement, features, created, context) VALUES "
                               "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def put_candidates(self, key: str, groups: str) -> None:
        """Remember a program's candidate actions (a JSON text; the caller owns the key and the format), so
        a process that meets a stored program again need not enumerate them."""
        with self._transaction():
            self._conn.execute("INSERT OR REPLACE INTO candidates VALUES (?, ?, ?)", (key, groups, time.time()))

    def put_pair(self, key: str, pair: dict[str, Any]) -> None:
        """Remember a paired timing of two programs (`measure.paired`; the caller owns the key, which must
        hold both programs, the target, the protocol and the measurement context)."""
        with self._transaction():
            self._conn.execute("INSERT OR REPLACE INTO pairs VALUES (?, ?, ?)",
                               (key, json.dumps(pair, sort_keys=True), time.time()))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction, taken immediately so concurrent writers queue instead of deadlocking."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # -- reading -------------------------------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        """The record under `key` (same shape as the items of `records`), or None."""
        row = self._conn.execute("SELECT key, workload, measurement, features FROM records WHERE key = ?",
                                 (key,)).fetchone()
        return None if row is None else self._record(row)

    def signature(self, uri: str) -> list | None:
        """The signature (JSON form) a workload was stored with by `add_workload`, or None."""
        row = self._conn.execute("SELECT signature FROM workloads WHERE uri = ?", (uri,)).fetchone()
        return None if row is None else json.loads(row[0])

    def preset(self, uri: str) -> str | None:
        """The preset a workload was stored with by `add_workload` (None where unknown or not given)."""
        row = self._conn.execute("SELECT preset FROM workloads WHERE uri = ?", (uri,)).fetchone()
        return None if row is None else row[0]

    def get_candidates(self, key: str) -> str | None:
        """The candidate list stored under `key` by `put_candidates`, or None."""
        row = self._conn.execute("SELECT groups FROM candidates WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def get_pair(self, key: str) -> dict[str, Any] | None:
        """The paired timing stored under `key` by `put_pair`, or None."""
        row = self._conn.execute("SELECT pair FROM pairs WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def find(self, workload: str, leir: str, target: str, protocol_key: str,
             context: str | None = None) -> dict[str, Any] | None:
        """The record of this exact program text of `workload` under `target`, `protocol_key` and
        `context`, found without lowering it (the fast path in front of `get(record_key(...))`), or None."""
        rows = self._conn.execute("SELECT key, workload, measurement, features FROM records WHERE workload = ? "
                                  "AND leir = ? AND target = ? AND context IS ?", (workload, leir, target, context))
        for row in rows:
            record = self._record(row)
            if _protocol_key(record["measurement"]["protocol"]) == protocol_key:
                return record
        return None

    def records(self, workload: str | None = None, ok_only: bool = False) -> Iterator[dict[str, Any]]:
        """Records in insertion order, optionally of one workload / without errors."""
        query = "SELECT key, workload, measurement, features FROM records"
        clauses, args = [], []
        if workload is not None:
            clauses.append("workload = ?")
            args.append(workload)
        if ok_only:
            clauses.append("error IS NULL AND median_s IS NOT NULL")
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        for row in self._conn.execute(query + " ORDER BY rowid", args):
            yield self._record(row)

    @staticmethod
    def _record(row: tuple) -> dict[str, Any]:
        key, uri, measurement, features = row
        return {"key": key, "workload": uri, "measurement": json.loads(measurement),
                "features": None if features is None else json.loads(features)}

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def stats(self) -> dict[str, Any]:
        total, ok, failed = self._conn.execute(
            "SELECT COUNT(*), SUM(error IS NULL), SUM(error IS NOT NULL) FROM records").fetchone()
        per_workload = self._conn.execute(
            "SELECT COALESCE(workload, '-'), COUNT(*) FROM records GROUP BY workload ORDER BY workload").fetchall()
        workloads = self._conn.execute("SELECT COUNT(*) FROM workloads").fetchone()[0]
        return {"path": str(self.path), "records": total or 0, "ok": ok or 0, "failed": failed or 0,
                "workloads": workloads, "bytes": self.path.stat().st_size if self.path.exists() else 0,
                "per_workload": dict(per_workload)}

    def export(self, path: Path | str, features: bool = True) -> int:
        """Write the workloads, then every record with the context it was measured in, one JSON object a
        line (gzip-compressed where `path` ends in .gz); returns the record count. `features=False` leaves
        the cost-model features out, a tenth of the size (`costmodel.dataset.load_dataset` computes them
        again from the program and its workload's signature): the form in which a collection moves between
        machines, or is kept in git between sessions on machines that do not last (`import_records`)."""
        count = 0
        with _open_text(path, "w") as f:
            for uri, preset, leir, signature in self._conn.execute(
                    "SELECT uri, preset, leir, signature FROM workloads ORDER BY rowid"):
                f.write(json.dumps({"uri": uri, "preset": preset, "leir": leir, "signature": json.loads(signature)},
                                   sort_keys=True) + "\n")
            for row in self._conn.execute("SELECT key, workload, measurement, features, context FROM records "
                                          "ORDER BY rowid"):
                record = dict(self._record(row[:4]), context=row[4])
                if not features:
                    record["features"] = None
                f.write(json.dumps(record, sort_keys=True) + "\n")
                count += 1
        return count

    def import_records(self, path: Path | str) -> int:
        """Add what `export` wrote: its workloads where this store has none of that URI, and its records
        where none is stored under the key (a record here is never replaced); returns how many records
        were new. The keys hold the measurement context, so records of other code or another machine are
        kept but never found by a lookup made here."""
        new = 0
        with _open_text(path, "r") as f, self._transaction():
            for line in f:
                item = json.loads(line)
                if "key" not in item:
                    self._conn.execute("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?, ?)",
                                       (item["uri"], item["preset"], item["leir"], json.dumps(item["signature"]),
                                        time.time()))
                    continue
                m, features = item["measurement"], item.get("features")
                cursor = self._conn.execute(
                    "INSERT OR IGNORE INTO records (key, workload, leir, target, protocol, median_s, error, "
                    "measurement, features, created, context) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (item["key"], item["workload"], m["leir"], m["target"], json.dumps(m["protocol"], sort_keys=True),
                     m.get("median_s"), m.get("error"), json.dumps(m, sort_keys=True),
                     None if features is None else json.dumps(features), time.time(), item.get("context")))
                new += cursor.rowcount
        return new

    def prune(self, failed: bool = True, older_than_s: float | None = None) -> int:
        """Delete failed records and/or records older than `older_than_s`; returns how many."""
        clauses, args = [], []
        if failed:
            clauses.append("error IS NOT NULL")
        if older_than_s is not None:
            clauses.append("created < ?")
            args.append(time.time() - older_than_s)
        if not clauses:
            return 0
        with self._transaction():
            cursor = self._conn.execute("DELETE FROM records WHERE " + " OR ".join(clauses), args)
        self._conn.execute("VACUUM")
        return cursor.rowcount
