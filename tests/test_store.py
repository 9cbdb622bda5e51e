"""ResultStore: a real SQLite file shared by processes; records survive writers that die mid-way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from steptp_env import Program
from steptp_env.measure import Protocol
from steptp_env.measure.store import ResultStore, record_key

SIG = [{"name": "A", "shape": [8], "dtype": "float32"}, {"name": "C", "shape": [8], "dtype": "float32",
                                                          "role": "output"}]


def fake(i: int, error: str | None = None) -> dict:
    return {"leir": f"prog{i}", "target": "llvm", "protocol": {"threads": 1}, "median_s": None if error else i * 1e-3,
            "error": error, "timings": [i * 1e-3] * 5}


def test_put_get_stats_export_prune(tmp_path):
    with ResultStore(tmp_path / "s.sqlite") as store:
        store.put("k1", fake(1), "level1/x", features=[1.0, 2.0])
        store.put("k2", fake(2, error="build failed"), "level1/x")
        store.put("k3", fake(3), "level1/y")
        assert store.get("k1")["measurement"]["median_s"] == 1e-3 and store.get("missing") is None
        assert [r["key"] for r in store.records(ok_only=True)] == ["k1", "k3"]
        assert next(store.records("level1/x"))["features"] == [1.0, 2.0]
        stats = store.stats()
        assert (stats["records"], stats["ok"], stats["failed"]) == (3, 2, 1)
        assert stats["per_workload"] == {"level1/x": 2, "level1/y": 1}
        assert store.export(tmp_path / "out.jsonl") == 3
        assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["key"] == "k1"
        assert store.prune(failed=True) == 1 and len(store) == 2


def test_export_and_import_move_workloads_records_and_contexts(tmp_path):
    """A store moves between machines (or sessions) as JSON lines: workloads, records with their contexts;
    without features it is smaller; an import keeps what the store holds and counts only new records."""
    program = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];", SIG)
    with ResultStore(tmp_path / "a.sqlite") as store:
        store.add_workload("level1/x", program, "tiny")
        store.put("k1", fake(1), "level1/x", features={"big": [0.5] * 400}, context="ctx1")
        store.put("k2", fake(2, error="build failed"), "level1/x", context="ctx1")
        assert store.export(tmp_path / "full.jsonl") == 2 and store.export(tmp_path / "lean.jsonl.gz", False) == 2
    assert (tmp_path / "lean.jsonl.gz").stat().st_size < (tmp_path / "full.jsonl").stat().st_size / 4
    with ResultStore(tmp_path / "b.sqlite") as other:
        other.put("k2", fake(7), "level1/x")  # already here: kept as it is
        assert other.import_records(tmp_path / "lean.jsonl.gz") == 1
        assert other.import_records(tmp_path / "lean.jsonl.gz") == 0
        assert other.signature("level1/x") == program.signature.to_json() and other.preset("level1/x") == "tiny"
        assert other.get("k1")["measurement"] == fake(1) and other.get("k1")["features"] is None
        assert other.find("level1/x", "prog1", "llvm", Protocol(threads=1).key, "ctx1")["key"] == "k1"
        assert other.get("k2")["measurement"]["median_s"] == 7e-3
    with ResultStore(tmp_path / "c.sqlite") as full:
        assert full.import_records(tmp_path / "full.jsonl") == 2 and full.get("k1")["features"] == {"big": [0.5] * 400}


def test_programs_lowering_to_the_same_module_share_a_key():
    a = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];", SIG)
    b = Program.parse("L^{8}_{c=0}[C^{f32,g}_{c}=A^{f32,g}_{c}*2;];", SIG)  # only a loop var renamed
    c = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*3;];", SIG)
    assert record_key(a, "llvm", "p") == record_key(b, "llvm", "p")
    assert record_key(a, "llvm", "p") != record_key(c, "llvm", "p")
    assert record_key(a, "llvm", "p") != record_key(a, "llvm", "q") != record_key(a, "cuda", "p")


def test_records_are_found_only_in_their_context(tmp_path):
    """A record made by other code, on another machine or for another workload (another context) is not
    found; nor is one from a store written before contexts existed, which opens and gains the column."""
    import sqlite3
    from dataclasses import asdict

    from steptp_env.measure import Protocol

    a = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];", SIG)
    assert record_key(a, "llvm", "p", "one") != record_key(a, "llvm", "p", "two") != record_key(a, "llvm", "p")
    protocol = Protocol(threads=1)
    protocol_key, measurement = protocol.key, dict(fake(1), leir=a.leir, protocol=asdict(protocol))
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as conn:  # the schema before contexts, with one record
        conn.execute("CREATE TABLE records (key TEXT PRIMARY KEY, workload TEXT, leir TEXT NOT NULL, target TEXT "
                     "NOT NULL, protocol TEXT NOT NULL, median_s REAL, error TEXT, measurement TEXT NOT NULL, "
                     "features TEXT, created REAL NOT NULL)")
        conn.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     ("old", "level1/x", a.leir, "llvm", "{}", 1e-3, None, json.dumps(measurement), None, 0.0))
    with ResultStore(old) as store:
        assert store.get("old") is not None  # still readable and exportable ...
        assert store.find("level1/x", a.leir, "llvm", protocol_key, "one") is None  # ... never reused
        store.put("new", measurement, "level1/x", context="one")
        assert store.find("level1/x", a.leir, "llvm", protocol_key, "one")["key"] == "new"
        assert store.find("level1/x", a.leir, "llvm", protocol_key, "two") is None


def test_the_context_follows_versions_machine_and_workload(monkeypatch):
    from steptp_env.measure import context as measurement_context
    from steptp_env.workloads import get_workload

    small, other = get_workload("level1/relu", preset="tiny"), get_workload("level1/relu", preset="tiny")
    assert measurement_context.context(small) == measurement_context.context(other)
    other.params = {**other.params, "extra": other.make_inputs(0)[other.program.signature.inputs[0].name]}
    other._digest = None
    assert measurement_context.context(small) != measurement_context.context(other)
    keys = set(measurement_context.versions())
    assert {"lowering", "verifier", "tvm", "llvm", "machine"} <= keys
    before = measurement_context.context(small)
    monkeypatch.setattr(measurement_context, "VERIFIER_VERSION", "next")
    measurement_context._versions.cache_clear()
    try:
        assert measurement_context.context(small) != before
    finally:
        monkeypatch.undo()
        measurement_context._versions.cache_clear()


WRITER = textwrap.dedent("""
    import sys
    from steptp_env.measure.store import ResultStore
    store = ResultStore(sys.argv[1])
    who = sys.argv[2]
    for i in range(500):
        store.put(f"{who}-{i}", {"leir": "x" * 200, "target": "llvm", "protocol": {}, "median_s": i,
                                 "error": None}, workload=who)
""")


def test_four_processes_write_500_records_each(tmp_path):
    path = tmp_path / "s.sqlite"
    ResultStore(path).close()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"w{k}"], env=env) for k in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    with ResultStore(path) as store:
        assert len(store) == 2000
        assert store.stats()["per_workload"] == {f"w{k}": 500 for k in range(4)}
        assert all(r["measurement"]["leir"] == "x" * 200 for r in store.records())
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


HOLDER = textwrap.dedent("""
    import sys, time
    from steptp_env.measure.store import ResultStore
    store = ResultStore(sys.argv[1])
    store.put("committed", {"leir": "a", "target": "llvm", "protocol": {}, "median_s": 1.0, "error": None})
    store._conn.execute("BEGIN IMMEDIATE")
    for i in range(1000):
        store._conn.execute("INSERT INTO records VALUES (?, NULL, 'b', 'llvm', '{}', 1.0, NULL, '{}', NULL, 0, NULL)",
                            (f"half-{i}",))
    print("inside", flush=True)
    time.sleep(60)
""")


def test_writer_killed_mid_transaction_leaves_a_consistent_store(tmp_path):
    path = tmp_path / "s.sqlite"
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "inside"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with ResultStore(path, timeout=10) as store:
        assert [r["key"] for r in store.records()] == ["committed"]
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        store.put("after", fake(2))  # the dead writer's lock is gone
        assert len(store) == 2
