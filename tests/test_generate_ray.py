"""`steptp generate --ray`: the rows of the local path, key for key, from two local Ray actors; an actor
killed in the middle of a workload loses that workload only, and a rerun completes it."""
from __future__ import annotations

import os
import signal

import pytest
from typer.testing import CliRunner

from steptp_env.cli import app
from steptp_env.data.generate import STEPS_FILE, GenerateConfig, generate
from steptp_env.data.records import read_records

ray = pytest.importorskip("ray")

WORKLOADS = ("level1/relu", "level1/softmax", "level2/gemm_relu_divide")
CONFIG = GenerateConfig(WORKLOADS, preset="tiny", per_strategy=1, workers=1, seed=3,
                        strategies=("loop_split", "loop_reorder", "operator_fusion"))


@pytest.fixture(autouse=True)
def _no_ray_token(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test run writes nothing under the home folder


def _rows(folder) -> dict[str, dict]:
    return {r["key"]: r for r in read_records(folder / STEPS_FILE) if r["kind"] in ("step", "rejected")}


def test_ray_generation_writes_the_local_rows(tmp_path):
    local = generate(CONFIG, tmp_path / "local")
    spread = generate(CONFIG, tmp_path / "ray", ray="local", actors=2)
    assert spread.workloads_done == local.workloads_done == len(WORKLOADS) and not spread.lost
    rows = _rows(tmp_path / "local")
    assert rows and _rows(tmp_path / "ray") == rows
    again = generate(CONFIG, tmp_path / "ray", ray="local", actors=2)  # resumed: everything is done
    assert again.written == 0 and _rows(tmp_path / "ray") == rows


def test_a_killed_actor_loses_its_workload_only(tmp_path):
    from steptp_env.data.generate_ray import generate_ray

    victim = WORKLOADS[1]

    def kill(uri: str, pid: int) -> None:
        if uri == victim:
            os.kill(pid, signal.SIGKILL)

    first = generate_ray(CONFIG, tmp_path / "out", "local", 2, started=kill)
    assert [lost.split(":")[0] for lost in first.lost] == [victim] and first.workloads_done == len(WORKLOADS) - 1
    written = _rows(tmp_path / "out")
    assert written and all(r["workload"] != victim for r in written.values())
    done = [r["key"] for r in read_records(tmp_path / "out" / STEPS_FILE) if r["kind"] == "done"]
    assert sorted(done) == sorted(CONFIG.prefix(u) for u in WORKLOADS if u != victim)
    result = CliRunner().invoke(app, ["generate", "--out", str(tmp_path / "out"), "--preset", "tiny",
                                      "--per-strategy", "1", "--workers", "1", "--seed", "3", "--ray", "local",
                                      *[a for s in CONFIG.strategies for a in ("-s", s)],
                                      *[a for w in WORKLOADS for a in ("-w", w)]])
    assert result.exit_code == 0, result.output
    assert _rows(tmp_path / "out") == _rows_of_local(tmp_path)


def _rows_of_local(tmp_path) -> dict[str, dict]:
    generate(CONFIG, tmp_path / "local")
    return _rows(tmp_path / "local")
