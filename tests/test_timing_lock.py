"""Timing discipline across processes: one timing at a time on the machine (a file lock every process
meets), and a one-thread timing pinned to one core."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from steptp_env.measure.worker import pinned

HOLDER = """
import json, time
from steptp_env.measure.runner import timing_lock
spans = []
for _ in range(3):
    with timing_lock():
        start = time.monotonic()
        time.sleep(0.2)
        spans.append((start, time.monotonic()))
print(json.dumps(spans))
"""


def test_processes_take_turns_under_the_timing_lock(tmp_path):
    """Two processes each hold the lock three times: no two holds overlap (CLOCK_MONOTONIC is one clock for
    the whole machine, so their spans compare)."""
    env = dict(os.environ, STEPTP_TIMING_LOCK=str(tmp_path / "timing.lock"))
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    spans = sorted(span for proc in procs for span in json.loads(proc.communicate(timeout=300)[0]))
    assert len(spans) == 6
    assert all(first[1] <= second[0] for first, second in zip(spans, spans[1:])), spans


def test_one_thread_timings_are_pinned_to_one_core():
    allowed = os.sched_getaffinity(0)
    with pinned(1):
        assert os.sched_getaffinity(0) == {max(allowed)}
    assert os.sched_getaffinity(0) == allowed
    with pinned(2):  # a multi-threaded protocol uses the cores it was given
        assert os.sched_getaffinity(0) == allowed
