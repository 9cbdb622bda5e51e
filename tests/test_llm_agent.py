"""The LLM agent: prompts in both answer styles, a real `transformers` model (tiny, built here) generating,
its completions stepped through the environment in text mode by greedy, beam and MCTS, and the
OpenAI-compatible backend against our server on 127.0.0.1."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

from llm_fixtures import tiny_chat_model  # noqa: E402

from agents import get_agent  # noqa: E402
from agents.llm import LLMPolicy, OpenAIBackend, TransformersBackend, backend_for, run  # noqa: E402
from agents.llm_server import make_server  # noqa: E402
from steptp_env.data.prompts import candidate_menu, parse_prompt  # noqa: E402
from steptp_env.env import StepTPEnv  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return TransformersBackend(tiny_chat_model(tmp_path_factory.mktemp("tiny-llm")))


def text_env(tmp_path, workload="level1/matmul", mode="model") -> StepTPEnv:
    return StepTPEnv(workload, "tiny", mode=mode, action_mode="text", obs_mode="text", store=tmp_path / "s.sqlite",
                     max_steps=4)


class FirstCandidates:
    """A backend that answers like a model that knows the menu: the state's first candidates, as action texts
    in the action style or as Step-TP answers (the applied program) in the ir style."""

    def __init__(self, env: StepTPEnv, style: str) -> None:
        self.env, self.style, self.calls = env, style, 0

    def generate(self, messages, n=1, max_new_tokens=256, temperature=0.0, seed=0):
        import json

        from steptp_env.strategies import apply_action, candidates

        self.calls += 1
        program = parse_prompt(messages[-1]["content"])
        actions = candidates(program)[:n]
        if self.style == "action":
            return [f"<think>try it</think><answer>{a.text}</answer>" for a in actions]
        return ["<answer>" + json.dumps({"transformed_IR": apply_action(program, a).leir,
                                         "applied_strategy": a.strategy}) + "</answer>" for a in actions]


def test_prompts_state_the_program_in_both_styles(tmp_path, tiny):
    env = text_env(tmp_path)
    env.reset(seed=0)
    action = LLMPolicy(tiny, style="action", candidates=5).messages(env)
    assert action[0]["role"] == "system" and parse_prompt(action[1]["content"]).leir == env.program.leir
    menu = candidate_menu(env.candidate_texts(), 5)  # strategies in turn: not only loop_split's factors
    assert len({text.split("(")[0] for text in menu}) == 5 and all(text in action[1]["content"] for text in menu)
    assert all(text not in action[1]["content"] for text in env.candidate_texts() if text not in menu)
    ir = LLMPolicy(tiny, style="ir").messages(env)
    assert "transformed_IR" in ir[1]["content"] and parse_prompt(ir[1]["content"]).leir == env.program.leir
    with pytest.raises(ValueError, match="style"):
        LLMPolicy(tiny, style="poem")


def test_a_real_model_generates_and_every_completion_becomes_a_step(tmp_path, tiny):
    """The tiny model's completions are noise: each becomes a step that the environment refuses with a
    reason (never an exception), and the run ends with the start program as its best."""
    env = text_env(tmp_path)
    result = run(env, 4, seed=0, backend=tiny, proposals=2, max_new_tokens=12)
    assert result.trajectory and all(step["error"] for step in result.trajectory)
    assert result.agent == "llm-greedy" and result.best_runtime_s == result.initial_runtime_s
    again = run(env, 4, seed=0, backend=tiny, proposals=2, max_new_tokens=12)
    assert [s["action"] for s in again.trajectory] == [s["action"] for s in result.trajectory]


@pytest.mark.parametrize("search", ["greedy", "beam", "mcts"])
@pytest.mark.parametrize("style", ["action", "ir"])
def test_proposals_drive_the_searches_in_both_answer_styles(tmp_path, search, style):
    env = text_env(tmp_path)
    backend = FirstCandidates(env, style)
    result = run(env, 6, seed=0, backend=backend, style=style, search=search, proposals=3)
    assert backend.calls >= 1 and result.agent == f"llm-{search}"
    accepted = [s for s in result.trajectory if not s["error"]]
    assert accepted, [s["error"] for s in result.trajectory]
    assert result.best_runtime_s <= result.initial_runtime_s and result.spent <= 6


def test_the_agent_needs_a_text_env(tmp_path, tiny):
    env = StepTPEnv("level1/matmul", "tiny", mode="model", store=tmp_path / "s.sqlite")
    with pytest.raises(ValueError, match="action_mode='text'"):
        run(env, 2, seed=0, backend=tiny)
    with pytest.raises(ValueError, match="search must be"):
        run(text_env(tmp_path), 2, seed=0, backend=tiny, search="anneal")
    assert get_agent("llm") is run


def test_completions_end_at_the_answer():
    """Generation stops at `</answer>`; what follows it (a batch's padding, a stop inside a token) is cut,
    and an OpenAI-style reply that left the stop string out gets it back."""
    from agents.llm import _closed, _through_answer

    assert _through_answer("<think>a</think><answer>x()</answer> and more") == "<think>a</think><answer>x()</answer>"
    assert _through_answer("<think>no answer yet") == "<think>no answer yet"
    assert _closed("<think>a</think><answer>x()", "stop") == "<think>a</think><answer>x()</answer>"
    assert _closed("<think>a</think><answer>x()", "length") == "<think>a</think><answer>x()"
    assert _closed("<answer>x()</answer>!", "stop") == "<answer>x()</answer>"


def test_openai_backend_against_our_server_on_localhost(tmp_path, tiny):
    server = make_server(tiny, "127.0.0.1", 0, name="tiny")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        remote = backend_for(f"{url}#tiny")
        assert isinstance(remote, OpenAIBackend) and remote.model == "tiny"
        messages = [{"role": "user", "content": "L^{4}_{a=0}[B_{a}=A_{a};];"}]
        assert remote.generate(messages, n=2, max_new_tokens=8, temperature=0.7, seed=1) == \
            tiny.generate(messages, n=2, max_new_tokens=8, temperature=0.7, seed=1)
        env = text_env(tmp_path)
        result = run(env, 2, seed=0, backend=remote, proposals=1, max_new_tokens=8)
        assert result.trajectory and result.trajectory[0]["error"]
        assert [m.id for m in remote.client.models.list().data] == ["tiny"]
    finally:
        server.shutdown()
        server.server_close()


def test_cli_runs_and_evaluates_an_llm_policy_from_a_model_folder(tmp_path, tiny):
    import json

    from typer.testing import CliRunner

    from steptp_env.cli import app

    folder = tiny_chat_model(tmp_path / "model")
    runner = CliRunner()
    ran = runner.invoke(app, ["run", "--agent", "llm", "--model", str(folder), "--workload", "level1/relu",
                              "--preset", "tiny", "--mode", "model", "--budget", "2", "--store",
                              str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "runs"), "--name", "llm"])
    assert ran.exit_code == 0, ran.output
    summary = json.loads((tmp_path / "runs" / "llm" / "summary.json").read_text())
    assert summary["agent"] == "llm-greedy" and summary["steps"] >= 1
    evaluated = runner.invoke(app, ["eval-step", "--model", str(folder), "--workloads", "level1/relu6", "--mode", "model",
                                    "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "eval.json")])
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["workloads"] == ["level1/relu6"] and {r["style"] for r in report["summary"]} == {"action", "ir"}
