"""measure: real builds and timings in a worker process; crashes, kills and hangs become failed results."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from steptp_env import Program
from steptp_env.measure.runner import Protocol, measure, measure_many, settle_workers, worker_for

SIG = [{"name": "A", "shape": [64, 64], "dtype": "float32"}, {"name": "B", "shape": [64, 64], "dtype": "float32"},
       {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "output"}]
MATMUL = Program.parse("L^{64}_{a=0}L^{64}_{c=0}L^{64}_{d=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*"
                       "B^{f32,g}_{d,c};];", SIG)
ONE = Protocol(threads=1, build_timeout=60, run_timeout=20)


def reference(t):
    return t["A"].astype(np.float64) @ t["B"]


def test_a_measurement_holds_timings_verdict_protocol_and_context():
    m = measure(MATMUL, reference, protocol=ONE)
    assert m.ok and m.error is None and m.verify.equivalent and m.verify.trials == 3
    assert len(m.timings) == 5 and m.median_s > 0 and m.number >= 1
    assert m.protocol.threads == 1 and "threads=1" in m.protocol.key
    assert m.build_s > 0 and m.verify_s > 0 and m.time_s > 0 and len(m.load_average) == 3
    assert set(m.versions) == {"steptp_env", "lowering", "verifier", "tvm", "llvm", "torch", "numpy", "machine"}
    assert m.versions["llvm"].split(".")[0].isdigit()  # the wheels' libinfo has no LLVM_VERSION: codegen's major
    assert m.to_dict()["median_s"] == m.median_s


def test_an_untimed_check_at_a_low_opt_level_keeps_its_kernel_apart_from_the_timed_one():
    """`opt_level` builds a kernel that is only verified; it is held under its own name in the worker, so a
    later paired timing of the same program builds the O3 kernel instead of finding the O1 one. A timed
    measurement at another level is refused: timings are always of the protocol's build."""
    from steptp_env.measure.worker import _ensure_built, kernel_key

    worker = worker_for(1, slot=7)
    try:
        m = measure(MATMUL, reference, protocol=ONE, worker=worker, timing=False, opt_level=1)
        assert m.verify.equivalent and m.timings == [] and m.build_s > 0
        args = (MATMUL.leir, MATMUL.signature.to_json(), "llvm")
        assert worker.call(_ensure_built, kernel_key(MATMUL, "llvm") + "/O1", *args, timeout=60) == 0.0
        assert worker.call(_ensure_built, kernel_key(MATMUL, "llvm"), *args, timeout=60) > 0.0
        wrong = Program.parse(MATMUL.leir.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{c,d}"), SIG)
        assert not measure(wrong, reference, protocol=ONE, worker=worker, timing=False, opt_level=1).verify.equivalent
    finally:
        worker.close()
    with pytest.raises(ValueError, match="untimed"):
        measure(MATMUL, reference, protocol=ONE, opt_level=1)


def test_fast_kernels_get_more_runs_per_timing():
    tiny = Program.parse("L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}+1;];",
                         [{"name": "A", "shape": [4], "dtype": "float32"},
                          {"name": "C", "shape": [4], "dtype": "float32", "role": "output"}])
    m = measure(tiny, lambda t: t["A"] + 1, protocol=ONE)
    assert m.ok and m.number > 1


def test_wrong_program_is_a_failed_measurement_without_timings():
    wrong = Program.parse(MATMUL.leir.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{c,d}"), SIG)
    m = measure(wrong, reference, protocol=ONE)
    assert not m.ok and m.error.startswith("not equivalent") and m.timings == []


def test_native_crash_is_a_failed_measurement_and_the_next_one_works():
    sig = [{"name": "A", "shape": [8], "dtype": "float32"}, {"name": "C", "shape": [8], "dtype": "float32",
                                                              "role": "output"}]
    wild = Program.parse("L^{8}_{a=0}[I^{i64,g}_{a}=a*4000000000000;];"
                         "L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{I^{i64,g}_{a}};];", sig)
    m = measure(wild, lambda t: t["A"], protocol=ONE)
    assert not m.ok and "crashed" in m.error
    assert measure(MATMUL, reference, protocol=ONE).ok


def test_reference_programs_run_in_the_worker_too():
    """Against another program (an imported row's original), the reference is built and run in the worker:
    one that crashes natively is a failed measurement, not the end of this process; an equivalent one
    verifies."""
    sig = [{"name": "A", "shape": [8], "dtype": "float32"}, {"name": "C", "shape": [8], "dtype": "float32",
                                                              "role": "output"}]
    copy = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a};];", sig)
    wild = Program.parse("L^{8}_{a=0}[I^{i64,g}_{a}=a*4000000000000;];"
                         "L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{I^{i64,g}_{a}};];", sig)
    m = measure(copy, wild, protocol=ONE, timing=False)
    assert not m.ok and "crashed" in m.error
    doubled = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];", sig)
    twice = Program.parse("L^{8}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}+A^{f32,g}_{a};];", sig)
    assert measure(doubled, twice, protocol=ONE, timing=False).ok
    assert not measure(copy, twice, protocol=ONE, timing=False).ok


def test_worker_killed_mid_run_is_a_failed_measurement_and_the_next_one_works():
    sig = [{"name": "A", "shape": [2048, 2048], "dtype": "float32"},
           {"name": "C", "shape": [2048], "dtype": "float32", "role": "output"}]
    slow = Program.parse("L^{2048}_{a=0}L^{2048}_{c=0}L^{2048}_{d=0}[C^{f32,g}_{a}=C^{f32,g}_{a}+"
                         "exp(A^{f32,g}_{a,c}*A^{f32,g}_{d,c});];", sig)
    worker = worker_for(1)

    def kill_when_running():
        deadline = time.time() + 60
        while time.time() < deadline:
            proc = worker._worker._proc
            if proc is not None and worker.lock.locked():
                time.sleep(2.0)
                os.kill(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    m = measure(slow, lambda t: t["A"].sum(1), protocol=ONE, worker=worker)
    killer.join()
    assert not m.ok and "crashed" in m.error
    assert measure(MATMUL, reference, protocol=ONE, worker=worker).ok


def test_hanging_kernel_times_out():
    sig = [{"name": "A", "shape": [4096, 4096], "dtype": "float32"},
           {"name": "C", "shape": [4096], "dtype": "float32", "role": "output"}]
    endless = Program.parse("L^{4096}_{a=0}L^{4096}_{c=0}L^{4096}_{d=0}[C^{f32,g}_{a}=C^{f32,g}_{a}+"
                            "exp(A^{f32,g}_{a,c}*A^{f32,g}_{d,c});];", sig)
    m = measure(endless, lambda t: t["A"].sum(1), protocol=Protocol(threads=1, run_timeout=2))
    assert not m.ok and "timed out" in m.error


def test_unsupported_target_is_a_failed_build():
    m = measure(MATMUL, reference, target="rocm", protocol=ONE)
    assert not m.ok and m.error.startswith("build failed") and "unsupported target" in m.error


def test_measure_many_keeps_order_with_parallel_builds():
    wrong = Program.parse(MATMUL.leir.replace("B^{f32,g}_{d,c}", "B^{f32,g}_{c,d}"), SIG)
    results = measure_many([MATMUL, wrong, MATMUL], reference, protocol=ONE, workers=2)
    assert [m.ok for m in results] == [True, False, True]


@pytest.fixture(autouse=True, scope="module")
def _close_workers():
    yield
    from steptp_env.measure import runner as module

    for worker in module._WORKERS.values():
        worker.close()
    module._WORKERS.clear()


def test_measuring_through_an_rpc_tracker_and_server_on_loopback():
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    from steptp_env.measure import Remote

    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    server = Server("127.0.0.1", port=9300, port_end=9400, tracker_addr=("127.0.0.1", tracker.port),
                    key="loopback-cpu", silent=True)
    try:
        time.sleep(1.0)  # the server registers with the tracker
        remote = m = None
        remote = Remote("127.0.0.1", tracker.port, "loopback-cpu")
        m = measure(MATMUL, reference, protocol=ONE, remote=remote.url)
        port = server.port
    finally:
        server.terminate()
        tracker.terminate()
    assert m.ok and m.verify.equivalent and m.target == f"llvm@{remote.url}"
    # timed there (how fast is the benchmarks' business, not a test's): every repeat, on the server's port
    assert len(m.timings) == ONE.repeat and m.median_s > 0 and m.device == f"127.0.0.1:{port}"


def test_large_arguments_and_results_travel_through_files(monkeypatch, tmp_path):
    """TVM's PopenWorker frames each message with a 32-bit length, so more than 2 GiB of inputs or
    outputs would end the child; above PIPE_LIMIT they go through a temporary file instead (the limit is
    lowered here so that a 64x64 matmul takes that route both ways), and no file is left behind."""
    from steptp_env.measure import worker

    monkeypatch.setattr(worker, "PIPE_LIMIT", 1024)
    monkeypatch.setattr(worker.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the child's files go there too
    seen = []
    unpack = worker._unpack
    monkeypatch.setattr(worker, "_unpack", lambda v: (seen.append(type(v).__name__), unpack(v))[1])
    m = measure(MATMUL, reference, protocol=ONE, worker=worker.MeasureWorker(1))
    assert m.ok and m.verify.equivalent, m.error
    assert "_InFile" in seen  # the run's outputs came back through a file
    assert list(tmp_path.iterdir()) == []


def test_settle_workers_waits_while_a_child_process_is_busy():
    """A child that spins for 0.6 s holds `settle_workers` about that long (a multi-threaded PyTorch timing
    waits so); an idle child does not."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass\n"
                             "time.sleep(30)"])
    try:
        time.sleep(0.05)
        assert 0.3 < settle_workers() < 3.0
        assert settle_workers() < 0.2
    finally:
        busy.kill()
        busy.wait()


def test_work_beside_a_call_runs_while_the_child_works_and_its_errors_are_dropped(tmp_path):
    """`beside` runs in the caller while the child is still busy (the child writes its marker only at the
    end of half a second, and `beside` finds none), and the child's answer comes back after it; an
    exception from `beside` (speculative work) neither fails the call nor the measurement."""
    from steptp_env.measure.worker import MeasureWorker

    marker = tmp_path / "done"
    seen = []
    child = lambda path: (time.sleep(0.5), open(path, "w").close(), 7)[2]  # noqa: E731  (pickled by value)
    worker = MeasureWorker(1)
    try:
        assert worker.call(child, str(marker), timeout=30, beside=lambda: seen.append(marker.exists())) == 7
        assert seen == [False] and marker.exists()

        def broken() -> None:
            raise RuntimeError("speculative work failed")

        assert worker.call(child, str(tmp_path / "again"), timeout=30, beside=broken) == 7
        m = measure(MATMUL, reference, protocol=ONE, worker=worker, beside=broken)
        assert m.ok and m.verify.equivalent, m.error
    finally:
        worker.close()
