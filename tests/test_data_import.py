"""Importing Step-TP chat rows: a few small rows of the sample import, verify and replay."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents import replay
from steptp_env.cli import app
from steptp_env.data.dataset import export_dataset
from steptp_env.data.filters import FilterConfig
from steptp_env.data.importer import import_rows, parse_steptp_prompt, replay_target
from steptp_env.env import StepTPEnv
from steptp_env.strategies import canonical_text

REF = Path(__file__).resolve().parents[1].parent / "shared" / "steptp-ref"

ROWS = {100: "layout_transformation", 112: "loop_fusion", 130: "loop_split"}  # small programs of the sample


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    path = REF / "chat_rows_sample.jsonl"
    if not path.exists():
        pytest.skip(f"no sample at {path}")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prompt_gives_program_and_roles(sample):
    model, program = parse_steptp_prompt(sample[0]["messages"][0]["content"])
    assert model == "Matmul_Subtract_Multiply_ReLU"
    assert [(t.name, t.role) for t in program.signature.tensors][-1] == ("F", "output")
    assert program.signature["A"].shape == (128, 10) and program.signature["G"].shape == ()


def test_small_rows_import_verify_and_replay(sample, tmp_path):
    rows = [sample[i] for i in ROWS]
    broken = json.loads(json.dumps(sample[130]))
    broken["messages"][1]["content"] = broken["messages"][1]["content"].replace('"loop_split"', '"loop_tiling"')
    results = import_rows(rows + [broken], workers=1)
    assert [r.status for r in results[:3]] == ["ok"] * 3, [r.reason for r in results]
    assert [r.record["strategy"] for r in results[:3]] == list(ROWS.values())
    assert all(r.record["verify"]["equivalent"] and r.record["explain"] for r in results[:3])
    assert results[3].status == "failed" and results[3].reason == "identify finds loop_split instead"
    record = results[2].record  # loop_split with factor 5: a candidate, so the replay agent takes it
    workload, state = replay_target(record)
    env = StepTPEnv(workload, mode="model", action_mode="text", target=state.target, store=tmp_path / "s.sqlite")
    replay.run(env, 1, 0, state=state)
    expected = type(env.program).parse(record["after"]["leir"], record["after"]["signature"])
    assert canonical_text(env.program) == canonical_text(expected)


def test_import_command_names_respellings_and_rows_export(sample, tmp_path):
    """`steptp import` on a small row and on row 19 (labelled cancellation, it only respells 1e-05 as 1.0e-5:
    the reference's bug, said as such); the accepted row exports as a chat row that re-validates."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(sample[i]) + "\n" for i in (100, 19)))
    runner = CliRunner()
    result = runner.invoke(app, ["import", str(rows), "--out", str(tmp_path / "imported.jsonl"), "--workers", "1"])
    assert result.exit_code == 0 and "row 1 (cancellation): cosmetic only" in result.output, result.output
    assert "verifying the rows of rows.jsonl: 1/1, " in result.output  # not a terminal: progress lines
    # imported rows state no runtimes: only with the speed filter off
    export_dataset([tmp_path / "imported.jsonl"], tmp_path / "export", config=FilterConfig(min_speedup=None),
                   parquet=False)
    exported = tmp_path / "export" / "data" / "train.jsonl"
    result = runner.invoke(app, ["validate-rows", str(exported), "--workers", "1"])
    assert result.exit_code == 0 and "1/1 rows valid" in result.output, result.output
    assert "validating train.jsonl: 1/1, " in result.output


def test_large_rows_get_one_draw_and_rows_beyond_memory_are_not_run(sample, monkeypatch):
    """Rows over SINGLE_DRAW_ITERATIONS are verified on one input draw; rows whose tensors would not fit
    (MEMORY_FRACTION of the machine's memory) are labelled, not run, and say why. The thresholds are lowered
    here so that a small row takes each path."""
    from steptp_env.data import importer

    monkeypatch.setattr(importer, "SINGLE_DRAW_ITERATIONS", 0)
    (result,) = import_rows([sample[130]], workers=1)
    assert result.status == "ok" and result.record["verify"]["trials"] == 1, result.reason
    monkeypatch.setattr(importer, "MEMORY_FRACTION", 2 ** -60)
    (result,) = import_rows([sample[130]], workers=1)
    assert result.status == "unverified" and "GiB of memory" in result.reason and result.record is None
