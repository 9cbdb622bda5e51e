"""`steptp generate`: verified rows only, resumable, and a SIGKILL loses and duplicates no finished row."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from steptp_env.data.records import read_records

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "steptp_env.cli", "generate", "-w", "level1/relu", "-w", "level1/softmax",
           "--preset", "tiny", "--mode", "model", "--per-strategy", "1", "--workers", "1"]


def _run(out: Path, wait: bool = True) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(COMMAND + ["--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if wait:
        output = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, output
    return proc


def _steps(path: Path) -> list[dict]:
    return [r for r in read_records(path) if r["kind"] == "step"] if path.exists() else []


def test_sigkill_and_restart_keep_every_row_once(tmp_path):
    steps = tmp_path / "steps.jsonl"
    proc = _run(tmp_path, wait=False)
    deadline = time.monotonic() + 600
    while len(_steps(steps)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["key"]: r for r in _steps(steps)}
    assert before, "the run wrote no row before it was killed"
    _run(tmp_path)
    records = list(read_records(steps))
    keys = Counter(r["key"] for r in records if r.get("key"))
    assert not [k for k, n in keys.items() if n > 1], "a work item was written twice"
    after = {r["key"]: r for r in records if r["kind"] == "step"}
    assert all(after[k] == r for k, r in before.items()), "a row written before the kill was lost or changed"
    assert all(r["verify"]["equivalent"] for r in after.values())
    assert sum(r["kind"] == "done" for r in records) == 2
    assert sum(r["kind"] == "header" for r in records) == 1
    rerun = _run(tmp_path)  # all done: nothing new
    assert Counter(r.get("key") for r in read_records(steps)) == Counter(r.get("key") for r in records)
    assert rerun.returncode == 0


def test_walks_chain_and_resume(tmp_path):
    """Multi-step walks: each step starts where the previous one ended; a second run adds nothing."""
    from steptp_env.data.generate import GenerateConfig, generate

    config = GenerateConfig(("level1/softmax",), preset="tiny", steps=2, walks=2, workers=1)
    first = generate(config, tmp_path)
    steps = _steps(tmp_path / "steps.jsonl")
    assert first.written == len(steps) > 0 and all(r["verify"]["equivalent"] for r in steps)
    by_walk: dict[str, list[dict]] = {}
    for record in steps:
        by_walk.setdefault(record["episode"], []).append(record)
    for walk in by_walk.values():
        assert [r["step"] for r in walk] == list(range(1, len(walk) + 1))
        assert all(a["after"] == b["before"] for a, b in zip(walk, walk[1:]))
    again = generate(config, tmp_path)
    assert again.written == again.rejected == 0 and _steps(tmp_path / "steps.jsonl") == steps


def test_a_timed_out_verification_is_tried_again_on_resume(tmp_path, monkeypatch):
    """A build that passes its timeout on a loaded machine says nothing about the program: the step is
    written as a transient rejection, its workload is not done, and the next run verifies it again."""
    from steptp_env.data import generate as module
    from steptp_env.data.generate import GenerateConfig, generate

    config = GenerateConfig(("level1/relu",), preset="tiny", per_strategy=1, workers=1,
                            strategies=("loop_split", "loop_reorder"))
    check_many = module.check_many

    def first_times_out(items, *args, **kwargs):
        reports = check_many(items, *args, **kwargs)
        return [{"equivalent": False, "reason": "build timed out (limit 120 s)"}] + reports[1:]

    monkeypatch.setattr(module, "check_many", first_times_out)
    generate(config, tmp_path)
    records = list(read_records(tmp_path / module.STEPS_FILE))
    transient = [r for r in records if r["kind"] == "rejected"]
    assert len(transient) == 1 and transient[0]["transient"] and not [r for r in records if r["kind"] == "done"]
    monkeypatch.setattr(module, "check_many", check_many)
    again = generate(config, tmp_path)
    assert again.written == 1 and again.workloads_done == 1
    steps = _steps(tmp_path / module.STEPS_FILE)
    assert transient[0]["key"] in {s["key"] for s in steps} and len(steps) == len({s["key"] for s in steps})
    assert generate(config, tmp_path).written == 0  # now done


def test_a_check_collects_garbage_only_after_a_large_program(monkeypatch):
    """A full garbage collection after every check was nearly half of generation's CPU time; `check` runs one
    only after a program whose tensors pass COLLECT_BYTES, and verifies either way."""
    import gc

    from steptp_env.data import verification
    from steptp_env.measure import Protocol
    from steptp_env.workloads import get_workload

    collections, collect = [], gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or collect(*a))
    wl = get_workload("level1/relu", preset="tiny")
    protocol = Protocol(threads=1)
    assert verification.check(wl.program, wl, protocol=protocol)["equivalent"] and collections == []
    monkeypatch.setattr(verification, "COLLECT_BYTES", 0)
    assert verification.check(wl.program, wl, protocol=protocol)["equivalent"] and len(collections) == 1
