"""The RPC measurement farm: a tracker and two servers on loopback; 100 measurements spread over both,
one server killed in the middle of the run, every measurement completed once, on a device that was up."""
from __future__ import annotations

import threading
import time

import pytest

from steptp_env import Program
from steptp_env.env import StepTPEnv
from steptp_env.measure import Protocol, measure_many
from steptp_env.measure.farm import devices, measure_farm

SIGNATURE = [{"name": "A", "shape": [16], "dtype": "float32"},
             {"name": "B", "shape": [16], "dtype": "float32", "role": "output"}]
DOUBLE = Program.parse("L^{16}_{a=0}[B^{f32,g}_{a}=A^{f32,g}_{a}*2.0;];", SIGNATURE)
QUICK = Protocol(threads=1, repeat=2, trials=1, build_timeout=60, run_timeout=20)


def reference(inputs):
    return {"B": inputs["A"] * 2}


@pytest.fixture
def farm():
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    servers = [Server("127.0.0.1", port=9300 + 100 * n, port_end=9400 + 100 * n,
                      tracker_addr=("127.0.0.1", tracker.port), key="farm-cpu", silent=True) for n in range(2)]
    url = f"rpc://127.0.0.1:{tracker.port}/farm-cpu"
    deadline = time.monotonic() + 30
    while devices(url) < 2 and time.monotonic() < deadline:  # the servers register with the tracker
        time.sleep(0.2)
    try:
        yield url, servers
    finally:
        for server in servers:
            server.terminate()
        tracker.terminate()


def test_a_farm_loses_a_server_and_completes_every_measurement_once(farm, tmp_path):
    url, servers = farm
    assert devices(url) == 2
    finished: list[int] = []
    killed = threading.Event()

    def done(index: int, m) -> None:
        finished.append(index)
        if len(finished) == 30:
            servers[0].terminate()
            killed.set()

    report = measure_farm([DOUBLE] * 100, reference, url, protocol=QUICK, done=done)
    assert killed.is_set() and sorted(finished) == list(range(100))  # each measurement's result once
    assert all(m.ok for m in report.results), [m.error for m in report.results if not m.ok]
    assert sum(report.by_device.values()) == 100 and len(report.by_device) == 2
    assert all(m.target == f"llvm@{url}" and m.device in report.by_device for m in report.results)
    lost = next(d for d in report.by_device if d.endswith(f":{servers[0].port}"))
    survivor = next(d for d in report.by_device if d != lost)
    assert report.results[finished[-1]].device == survivor  # the last to finish ran on the server still up
    assert [m.device for m in measure_many([DOUBLE] * 2, reference, remote=url, protocol=QUICK)] == [survivor] * 2
    env = StepTPEnv("level1/relu", "tiny", mode="measure", store=tmp_path / "s.sqlite", remote=url, protocol=QUICK)
    _, info = env.reset(seed=0)
    assert info["device"] == survivor and info["runtime_source"] == "measured"
    with pytest.raises(ValueError, match="paired_rewards"):
        StepTPEnv("level1/relu", "tiny", mode="measure", remote=url, paired_rewards=True)
