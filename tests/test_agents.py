"""The agents in `model` mode on tiny workloads: never worse than their start, deterministic per seed,
replayable; `steptp run` writes its run with the side-by-side figures; PyTorch is timed by a direct call;
MaskablePPO learns to beat the random policy."""
from __future__ import annotations

import ctypes.util
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from agents import AGENTS, get_agent
from agents.common import Move, Search
from agents.compare import compare, describe, torch_seconds
from steptp_env.cli import app
from steptp_env.data.dataset import export_dataset
from steptp_env.data.export import ExportOptions
from steptp_env.data.filters import FilterConfig, filter_episodes
from steptp_env.data.records import read_records
from steptp_env.env import EnvState, StepTPEnv
from steptp_env.errors import StepTPError
from steptp_env.frontend.workload import Workload, from_torch
from steptp_env.ir.analysis import reduction
from steptp_env.ir.ast import equations
from steptp_env.ir.printer import print_expr, print_nest
from steptp_env.measure import Protocol
from steptp_env.workloads import get_workload

SEARCH = ["random", "greedy", "beam", "focus", "bfs", "dfs", "mcts"]


def make_env(tmp_path, workload="level1/matmul", max_steps=6, mode="model") -> StepTPEnv:
    return StepTPEnv(workload, "tiny", mode=mode, store=tmp_path / "s.sqlite", max_steps=max_steps)


def actions(result) -> list[str]:
    return [step["action"] for step in result.trajectory]


def test_registry_names_every_agent():
    assert set(AGENTS) == {"random", "greedy", "beam", "focus", "bfs", "dfs", "mcts", "replay", "ppo", "llm"}
    with pytest.raises(KeyError, match="known: random"):
        get_agent("annealing")


@pytest.mark.parametrize("name", SEARCH)
def test_search_agent_keeps_its_best_and_is_deterministic(tmp_path, name):
    env = make_env(tmp_path)
    first = get_agent(name)(env, 12, seed=3)
    again = get_agent(name)(env, 12, seed=3)
    assert first.best_runtime_s <= first.initial_runtime_s and first.speedup >= 1.0
    assert first.trajectory and len(first.trajectory) == first.spent <= 12
    assert first.best_leir == again.best_leir and actions(first) == actions(again)
    assert [step["action"] for step in first.path()] == first.state.actions
    assert first.state.workload == "level1/matmul_square" and first.counts["measured"] == 0


def test_a_move_the_model_cannot_rate_ranks_last(tmp_path, monkeypatch):
    """A program whose model features cannot be computed (its lowering fails) must not stop the search: the
    ranking puts it last and its step reports why (a LoweringError from `rank_moves` ended whole benchmark
    items)."""
    from agents.common import Search
    from steptp_env.errors import LoweringError
    from steptp_env.strategies import apply_action

    env = make_env(tmp_path)
    search = Search(env, 4, 0, "beam")
    root = search.root()
    moves = search.moves(root)[:3]
    unrated = apply_action(root.env.program, moves[0].text).leir
    rate = root.env.oracle.predict

    def predict(program):
        if program.leir == unrated:
            raise LoweringError("TVM rejected the lowered program")
        return rate(program)

    monkeypatch.setattr(root.env.oracle, "predict", predict)
    ranked = search.rank_moves(root, moves)
    assert ranked[-1] == moves[0] and len(ranked) == 3


@pytest.mark.parametrize("name", ["greedy", "beam", "focus", "mcts"])
def test_guided_agents_find_a_faster_matmul(tmp_path, name):
    assert get_agent(name)(make_env(tmp_path), 12, seed=0).speedup > 1.0


def test_replay_reproduces_a_recorded_state(tmp_path):
    env = make_env(tmp_path)
    recorded = get_agent("beam")(env, 16, seed=0)
    assert recorded.state.actions
    path = recorded.state.save(tmp_path / "state.json")
    replayed = get_agent("replay")(env, 64, seed=1, state=path)
    assert replayed.state.actions == recorded.state.actions
    assert replayed.best_leir == recorded.best_leir == env.program.leir
    assert replayed.best_runtime_s == pytest.approx(recorded.best_runtime_s)
    with pytest.raises(StepTPError, match="cannot replay"):
        get_agent("replay")(env, 8, seed=0, state=["loop_split(nest=7, loop=z, factor=3)"])


def test_replay_keeps_every_action_past_the_best_program(tmp_path):
    env = make_env(tmp_path)
    search = Search(env, 8, 0, "probe")
    first = search.rank(search.root())[0]
    node = search.step(search.root(), first)
    worst = search.rank(node)[-1]  # the move the model expects slowest: the episode ends past its best
    replayed = get_agent("replay")(env, 8, seed=0, state=[first.text, worst.text])
    assert replayed.best_entry == 0 and replayed.state.actions == [first.text, worst.text]


def test_a_measured_replay_says_it_served_stored_timings_until_fresh(tmp_path):
    env = StepTPEnv("level1/relu", "tiny", mode="measure", store=tmp_path / "s.sqlite", protocol=Protocol(threads=1))
    env.reset(seed=0)
    assert env.step(int(np.flatnonzero(env.action_masks()[1:])[0] + 1))[4]["runtime_source"] == "measured"
    state = str(env.state.save(tmp_path / "state.json"))
    runner = CliRunner()
    common = ["--workload", "level1/relu", "--preset", "tiny", "--mode", "measure", "--budget", "2",
              "--threads", "1", "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "runs")]
    stored = runner.invoke(app, ["run", "--agent", "replay", "--state", state, "--name", "again", *common])
    assert stored.exit_code == 0 and "came from the store" in stored.output, stored.output
    fresh = runner.invoke(app, ["run", "--agent", "replay", "--state", state, "--name", "fresh", "--fresh", *common])
    assert fresh.exit_code == 0 and "came from the store" not in fresh.output, fresh.output
    summary = json.loads((tmp_path / "runs" / "fresh" / "summary.json").read_text())
    assert summary["counts"]["stored"] == 0 and summary["counts"]["measured"] >= 1


def test_budget_counts_measurements_outside_model_mode(tmp_path):
    result = get_agent("greedy")(make_env(tmp_path, "level1/relu", mode="measure"), 3, seed=0)
    assert 1 <= result.spent <= 3 and result.spent == result.counts["measured"] + result.counts["stored"]
    assert result.best_source in ("measured", "stored") and result.best_runtime_s <= result.initial_runtime_s


def test_cli_run_writes_state_and_trajectory(tmp_path):
    runner = CliRunner()
    common = ["--workload", "level1/matmul", "--preset", "tiny", "--mode", "model", "--budget", "8",
              "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "runs")]
    ran = runner.invoke(app, ["run", "--agent", "greedy", "--name", "greedy", *common])
    assert ran.exit_code == 0, ran.output
    assert "(start)" in ran.output and "best program" in ran.output
    assert re.search(r"^greedy: 1 steps, best x[\d.]+: \d/8, \d+ s$", ran.output, re.M)  # not a terminal: lines
    folder = tmp_path / "runs" / "greedy"
    state = EnvState.load(folder / "state.json")
    header, reset, *steps = [json.loads(line) for line in (folder / "trajectory.jsonl").read_text().splitlines()]
    assert header["format"] == "steptp-trajectory" and header["config"]["agent"] == "greedy"
    assert reset["kind"] == "reset" and state.actions and 1 <= len(steps) <= 8
    assert {"action", "reward", "runtime_after_s", "source_after", "error", "parent"} <= set(steps[0])
    summary = json.loads((folder / "summary.json").read_text())
    for key in ("compared_start_s", "compared_best_s", "compared_speedup", "torch_s", "best_vs_torch"):
        assert summary[key] > 0, (key, summary)
    assert summary["compared_threads"] == 1 and summary["compared_note"] is None  # the packaged model's
    assert "PyTorch eager" in ran.output and "best/PyTorch" in ran.output
    replayed = runner.invoke(app, ["run", "--agent", "replay", "--state", str(folder / "state.json"),
                                   "--name", "replay", *common])
    assert replayed.exit_code == 0, replayed.output
    assert EnvState.load(tmp_path / "runs" / "replay" / "state.json").actions == state.actions
    unknown = runner.invoke(app, ["run", "--agent", "annealing", *common])
    assert unknown.exit_code == 2 and "unknown agent" in unknown.output
    other = runner.invoke(app, ["run", "--agent", "greedy", "--threads", "2", *common])
    assert other.exit_code == 2 and "trained on timings at 1 thread" in other.output


def test_a_search_run_exports_every_step_with_its_parent(tmp_path):
    """`steptp run`'s trajectory.jsonl is a trajectory file: chat rows from every kept step of the search
    tree, conversations from its start-to-leaf paths; a file of another format is refused by name."""
    result = get_agent("beam")(make_env(tmp_path, "level1/softmax", max_steps=4), 12, seed=0)
    folder = result.save(tmp_path / "run")
    reset, *steps = list(read_records(folder / "trajectory.jsonl"))[1:]
    assert len(steps) == len(result.trajectory) and any(s["parent"] > 0 for s in steps)
    reached = {0: reset["leir"], **{s["step"]: s["after"]["leir"] for s in steps if s["after"]}}
    assert all(s["before"]["leir"] == reached[s["parent"]] for s in steps)  # each step starts at its parent
    rows, report = export_dataset([folder], tmp_path / "chat",
                                  config=FilterConfig(require_verified=False, min_speedup=None))
    assert report.total == len(steps) and report.kept == len(rows) > 0
    conversations, paths = export_dataset([folder], tmp_path / "episodes", ExportOptions("trajectory"),
                                          FilterConfig(require_verified=False))
    assert 1 < len(conversations) and paths.total == len(steps) and paths.kept <= len(steps)
    for episode in filter_episodes(steps, FilterConfig(require_verified=False))[0]:
        assert all(a["after"]["leir"] == b["before"]["leir"] for a, b in zip(episode, episode[1:]))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "trajectory.jsonl").write_text(json.dumps(result.trajectory[0]) + "\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["export", str(tmp_path / "old"), "--out", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "is not a trajectory file" in refused.output, refused.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["export", str(tmp_path / "empty"), "--out", str(tmp_path / "y")])
    assert empty.exit_code == 2 and "no .jsonl files" in empty.output, empty.output


def test_cli_runs_and_replays_a_saved_workload_folder(tmp_path):
    torch.manual_seed(0)
    folder = from_torch(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()),
                        torch.randn(8, 16)).save(tmp_path / "my_model")
    runner = CliRunner()
    common = ["--workload", str(folder), "--mode", "model", "--budget", "4", "--store", str(tmp_path / "s.sqlite"),
              "--out", str(tmp_path / "runs")]
    ran = runner.invoke(app, ["run", "--agent", "greedy", *common])
    assert ran.exit_code == 0, ran.output
    run, = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-greedy-my_model")
    state = EnvState.load(run / "state.json")
    assert state.actions and state.workload.startswith("torch/")
    replayed = runner.invoke(app, ["run", "--agent", "replay", "--state", str(run / "state.json"), "--name",
                                   "replay", *common])
    assert replayed.exit_code == 0, replayed.output
    assert EnvState.load(tmp_path / "runs" / "replay" / "state.json").actions == state.actions
    shown = runner.invoke(app, ["workloads", "show", str(folder)])
    assert shown.exit_code == 0 and f"saved as {state.workload}" in shown.output, shown.output


def test_compare_times_start_best_and_pytorch_side_by_side(tmp_path):
    env = StepTPEnv("level1/matmul", "tiny", mode="model", store=tmp_path / "s.sqlite", max_steps=4,
                    protocol=Protocol(threads=1, repeat=3))
    searched = get_agent("greedy")(env, 8, seed=0)
    assert searched.torch_s is None and searched.best_vs_torch is None  # only `compare` times side by side
    result = compare(env, searched)
    assert result.best_leir == searched.best_leir and result.trajectory == searched.trajectory
    assert result.compared_start_s > 0 and result.compared_best_s > 0 and result.torch_s > 0
    assert result.compared_speedup == pytest.approx(result.compared_start_s / result.compared_best_s)
    assert result.best_vs_torch == pytest.approx(result.compared_best_s / result.torch_s)
    assert result.compared_threads == 1 and result.compared_note is None
    line = describe(result)
    assert line.startswith("best ") and "PyTorch eager" in line and line.endswith("1 thread)")


def test_compare_without_a_module_names_the_reason(tmp_path):
    env = StepTPEnv("level1/relu", "tiny", mode="model", store=tmp_path / "s.sqlite", max_steps=2)
    searched = get_agent("greedy")(env, 2, seed=0)
    env.workload.module = None  # as a workload loaded without its module would be
    result = compare(env, searched)
    assert result.compared_start_s is result.compared_best_s is result.torch_s is result.best_vs_torch is None
    assert "no PyTorch module" in result.compared_note and "no PyTorch module" in describe(result)
    assert json.loads(json.dumps(result.summary()))["best_vs_torch"] is None


STEADY_ALLOCATOR_PROBE = """
import ctypes, ctypes.util, resource, torch
from agents.compare import steady_allocator
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallopt(-3, 128 << 10), libc.mallopt(-1, 128 << 10)  # glibc's fixed defaults: 1 MiB blocks are mmapped
def faults():
    for _ in range(3):
        torch.ones(1 << 18).sum()  # warm-up: the heap's first growth faults once
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        torch.ones(1 << 18).sum()  # a 1 MiB output, freed at once, as a PyTorch call's are
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 20
print(faults(), steady_allocator(), faults())
"""


def test_pytorch_is_timed_with_the_allocator_at_its_steady_state():
    """With 1 MiB blocks mapped afresh on each call (the state some processes were in: eager calls 6x slower),
    every call page-faults on its output; `steady_allocator` (which `torch_seconds` calls) stops that."""
    if not ctypes.util.find_library("c") or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"):
        pytest.skip("not glibc")
    outputs = []
    for _ in range(3):  # the faulting state is set up by the OS's mmap; once in a full suite it was not (0 faults)
        run = subprocess.run([sys.executable, "-c", STEADY_ALLOCATOR_PROBE], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent.parent, timeout=120, check=True)
        before, changed, after = run.stdout.split()
        outputs.append(run.stdout.strip())
        if float(before) > 200:
            break
    assert float(before) > 200, f"the probe never reached the faulting state: {outputs}"
    assert changed == "True" and float(after) < 10, outputs


class CountingModule(torch.nn.Module):
    """Wraps a module and records, per call, whether inference mode was on and how many threads torch had."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[tuple[bool, int]] = []

    def forward(self, *args):
        self.calls.append((torch.is_inference_mode_enabled(), torch.get_num_threads()))
        return self.inner(*args)


def test_torch_seconds_calls_the_module_directly(monkeypatch):
    workload = get_workload("level1/relu", "tiny")
    workload.module = CountingModule(workload.module)

    def forbidden(*args, **kwargs):
        raise AssertionError("PyTorch must be timed by a direct module call")

    monkeypatch.setattr(Workload, "reference", forbidden)
    monkeypatch.setattr(torch.func, "functional_call", forbidden)
    threads = torch.get_num_threads()
    seconds = torch_seconds(workload, Protocol(threads=1, repeat=4, min_seconds=0.0))
    assert seconds > 0 and torch.get_num_threads() == threads
    assert workload.module.calls == [(True, 1)] * 5  # one warm-up call, then 4 blocks of one call


def test_maskable_ppo_beats_the_random_policy(tmp_path):
    from agents.ppo import describe_finals, evaluate, measured_finals, policy_of, run, train
    from agents.random_search import random_policy

    env = StepTPEnv(["level1/matmul", "level1/softmax", "level1/relu"], "tiny", mode="model",
                    store=tmp_path / "s.sqlite", max_steps=4)
    model = train(env, 5000, seed=0)
    seeds = range(100, 112)
    trained = statistics.mean(evaluate(policy_of(model), env, seeds))
    baseline = statistics.mean(evaluate(random_policy(0), env, seeds))
    assert trained > baseline, (trained, baseline)
    result = run(env, 1, seed=0, policy=model)
    assert result.best_runtime_s <= result.initial_runtime_s
    print(f"PPO 5000 steps: mean return {trained:.3f} against random {baseline:.3f}")
    rows = measured_finals(policy_of(model), env, seeds[:2])  # the final programs, verified and measured
    assert [r["errors"] for r in rows] == [[], []] and all(r["measured"] > 0 and r["claimed"] > 0 for r in rows)
    assert "stopping at once" in describe_finals(rows)


def test_ppo_command_prints_the_training_log_and_writes_tensorboard_logs(tmp_path):
    import typer

    from agents.ppo import main

    app = typer.Typer()
    app.command()(main)
    args = ["-w", "level1/relu", "--preset", "tiny", "--timesteps", "64", "--max-steps", "4", "--episodes", "2",
            "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "ppo.zip"),
            "--tensorboard", str(tmp_path / "tb")]
    ran = CliRunner().invoke(app, args)
    assert ran.exit_code == 0, ran.output
    assert "total_timesteps" in ran.output and "stopping at once" in ran.output and "random" in ran.output
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


def test_a_greedy_run_of_ten_steps_replays_and_validates(tmp_path):
    env = make_env(tmp_path, "level1/matmul", max_steps=10)
    result = get_agent("greedy")(env, 200, seed=0, width=2)
    assert 3 <= len(result.state.actions) <= 10
    fresh = make_env(tmp_path, "level1/matmul", max_steps=10)
    fresh.apply(result.state)
    assert fresh.program.leir == result.best_leir
    report = fresh.validate(result.state)
    assert report["ok"], report["errors"]
    assert report["final_leir"] == result.best_leir



def test_focus_visits_the_heaviest_nest_first_and_keeps_a_phase_on_its_nests(tmp_path):
    """On an attention block the heaviest nest by work is a GEMM-like reduction, the run's first step acts
    on it, and a phase offers only moves on its nest or on nests its own moves made or changed."""
    from agents.common import Search
    from agents.focus import _nests_of, _order, _Phase

    env = make_env(tmp_path, "level2/mha", max_steps=8)
    root = Search(env, 10, 0, "focus").root()
    heaviest, _ = next(iter(_order(root, set())))
    loops_and_equations = list(equations(env.program.nests[heaviest]))
    assert any(reduction(loops, eq) is not None and "*" in print_expr(eq.rhs) for loops, eq in loops_and_equations)
    phase = _Phase(root, heaviest)
    search = Search(env, 10, 0, "focus")
    offered = phase.moves(search, search.root())
    assert offered and all(_nests_of(move) == {heaviest} for move in offered)
    split = next(m for m in offered if m.text.startswith("reduction_factorization"))
    child = search.step(search.root(), split)
    assert len(child.env.program.nests) > len(env.program.nests)  # the combine nest is new, so it is offered
    touched = set().union(*(_nests_of(m) for m in phase.moves(search, child)))
    texts = [print_nest(nest) for nest in child.env.program.nests]
    assert len(touched) >= 2 and not {texts[i] for i in touched} & phase.frozen
    result = get_agent("focus")(make_env(tmp_path, "level2/mha", max_steps=8), 10, seed=0)
    assert _nests_of(Move(0, result.trajectory[0]["action"])) == {heaviest}
