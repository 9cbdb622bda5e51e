"""The evaluation protocol (`agents.evaluate`, `steptp eval`) and its versioned suites."""
from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from agents.evaluate import EvalConfig, evaluate, interval, load_runs, run_times, summarise
from steptp_env.cli import app
from steptp_env.costmodel.default import DEFAULT_MODEL_DIR
from steptp_env.workloads import list_workloads, spec
from steptp_env.workloads.suites import EVAL_SUITES, EvalSuite, UnknownSuiteError, eval_suite

TWO = ("level1/relu", "level1/softmax")


@pytest.fixture
def two_workloads(monkeypatch):
    """A two-workload suite at tiny, so a test runs in seconds (the published suites hold 18)."""
    monkeypatch.setitem(EVAL_SUITES, "test-two", EvalSuite("test-two", "tiny", TWO))
    return "test-two"


def test_eval_small_v0_is_the_documented_family_split():
    """One workload per family that has one outside the packaged cost model's training set, drawn as the
    module docstring says: the rule and the frozen list agree, and no workload was trained on."""
    trained = set(np.load(DEFAULT_MODEL_DIR / "data.npz", allow_pickle=True)["groups"].tolist())
    families = collections.defaultdict(list)
    for uri in list_workloads():
        families[spec(uri).family].append(uri)
    rng = random.Random(0)
    drawn = tuple(rng.choice(sorted(u for u in families[f] if u not in trained)) for f in sorted(families)
                  if any(u not in trained for u in families[f]))
    suite = eval_suite("eval-small-v0")
    assert suite.uris == drawn and suite.preset == "small" and len(drawn) == 18
    assert not set(suite.uris) & trained
    assert eval_suite("eval-tiny-v0").uris == suite.uris and eval_suite("eval-tiny-v0").preset == "tiny"


def test_an_unknown_suite_names_the_known_ones():
    with pytest.raises(UnknownSuiteError, match="eval-small-v0"):
        EvalConfig("greedy", "eval-small-v9", 16)


def test_the_interval_is_students_t():
    low, high = interval([1.0, 2.0, 3.0])  # mean 2, standard error 1/sqrt(3), t(0.975, 2) = 4.3027
    assert low == pytest.approx(2 - 4.3027 / 3 ** 0.5, abs=1e-3) and high == pytest.approx(2 + 4.3027 / 3 ** 0.5, abs=1e-3)
    assert interval([1.5]) is None and interval([2.0, 2.0]) == (2.0, 2.0)


def test_an_evaluation_times_every_run_side_by_side_and_resumes(two_workloads, tmp_path):
    config = EvalConfig("random", two_workloads, budget=2, seeds=2)
    seen = []
    summary = evaluate(config, tmp_path, lambda record, done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    runs = load_runs(tmp_path / "runs.jsonl", config)
    assert [(r["uri"], r["seed"]) for r in runs] == [(TWO[0], 0), (TWO[0], 1), (TWO[1], 0), (TWO[1], 1)]
    for r in runs:
        assert "error" not in r, r["error"]
        assert r["start_s"] > 0 and r["best_s"] > 0 and r["eager_s"] > 0 and r["machine"] and r["best_leir"]
    assert summary["timed_in_every_seed"] == 2 and len(summary["per_seed"]) == 2 and not summary["failed"]
    for figure in ("speedup", "vs_eager"):
        low, high = summary[f"{figure}_95"]
        assert low <= summary[figure] <= high
        per_seed = [p[figure] for p in summary["per_seed"]]
        assert summary[figure] == pytest.approx(sum(per_seed) / 2)
    first = summary["per_seed"][0]
    (start0, best0), (start2, best2) = run_times(runs[0]), run_times(runs[2])
    assert first["speedup"] == pytest.approx((start0 / best0 * start2 / best2) ** 0.5)
    report = (tmp_path / "report.md").read_text()
    assert config.command() in report and TWO[1] in report and (tmp_path / "report.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["command"] == config.command()
    lines = (tmp_path / "runs.jsonl").read_text().count("\n")
    evaluate(config, tmp_path)  # everything is done: nothing runs again
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == lines
    more = EvalConfig("random", two_workloads, budget=2, seeds=3)  # a third seed extends the same runs
    assert len(load_runs(tmp_path / "runs.jsonl", more)) == 4
    assert len(evaluate(more, tmp_path)["per_seed"]) == 3
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == lines + 2


def test_a_run_that_ends_at_its_start_program_has_its_two_timings_pooled(two_workloads):
    config = EvalConfig("greedy", two_workloads, budget=1, seeds=1)
    stayed = {"uri": TWO[0], "seed": 0, "path": [], "start_s": 1.0e-3, "best_s": 1.44e-3, "eager_s": 2.4e-3}
    moved = {"uri": TWO[1], "seed": 0, "path": ["loop_split(nest=0, loop=a, factor=2)"], "start_s": 1.0e-3,
             "best_s": 0.5e-3, "eager_s": 1.0e-3}
    assert run_times(stayed) == pytest.approx((1.2e-3, 1.2e-3)) and run_times(moved) == (1.0e-3, 0.5e-3)
    summary = summarise(config, [stayed, moved])
    assert summary["speedup"] == pytest.approx(2 ** 0.5)  # 1 (one program) and 2
    assert summary["vs_eager"] == pytest.approx((2.4 / 1.2 * 2) ** 0.5)


def test_a_failing_agent_is_a_recorded_run_that_a_rerun_tries_again(two_workloads, tmp_path):
    config = EvalConfig("ppo", two_workloads, budget=2, seeds=1, policy=str(tmp_path / "missing.zip"))
    summary = evaluate(config, tmp_path)
    assert len(summary["failed"]) == 2 and summary["speedup"] is None and summary["timed_in_every_seed"] == 0
    assert "missing.zip" in summary["failed"][0]["error"] and "failed: level1/relu" in (tmp_path / "report.md").read_text()
    evaluate(config, tmp_path)
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 4  # both tried again, the last record counts
    assert len(load_runs(tmp_path / "runs.jsonl", config)) == 2


def test_steptp_eval_writes_the_report(two_workloads, tmp_path):
    runner = CliRunner()
    done = runner.invoke(app, ["eval", "--agent", "greedy", "--suite", two_workloads, "--budget", "2", "--seeds", "1",
                               "--out", str(tmp_path / "e")])
    assert done.exit_code == 0, done.output
    assert "speedup over the start program" in done.output and "0 failed run(s)" in done.output
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["config"]["agent"] == "greedy" and summary["timed_in_every_seed"] == 2
    missing = runner.invoke(app, ["eval", "--suite", two_workloads])
    assert missing.exit_code != 0 and "--agent" in missing.output
    wrong = runner.invoke(app, ["eval", "--agent", "replay", "--suite", two_workloads])
    assert wrong.exit_code == 2 and "unknown agent 'replay' for evaluation" in wrong.output
    unknown = runner.invoke(app, ["eval", "--agent", "greedy", "--suite", "eval-big-v7"])
    assert unknown.exit_code == 2 and "known: eval-small-v0" in unknown.output
