"""The Gymnasium environment: API conformance, never-raise fuzzing, text actions, replay and validation,
vectorised use. Model mode throughout (deterministic, no timing), each test with its own store."""
from __future__ import annotations

import json
import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import steptp_env  # noqa: F401  (registers the ids)
from steptp_env import from_torch
from steptp_env.env import STOP, EnvState, StepTPEnv
from steptp_env.errors import StepTPError
from steptp_env.frontend.workload import Workload

TINY = ["level1/matmul", "level1/softmax", "level1/relu", "level1/layer_norm", "level1/sum_over_dim",
        "level1/conv1d_padded_bias", "level1/log_softmax", "level2/gemm_relu_divide", "level1/matvec",
        "level1/conv2d"]


def make(tmp_path, workload="level1/softmax", **kwargs) -> StepTPEnv:
    kwargs.setdefault("mode", "model")
    return StepTPEnv(workload, preset="tiny", store=tmp_path / "store.sqlite", **kwargs)


@pytest.mark.parametrize("modes", [{}, {"obs_mode": "text", "action_mode": "text"}])
def test_check_env_passes(tmp_path, modes):
    check_env(make(tmp_path, **modes), skip_render_check=True)


def test_registered_ids_and_mode_metadata():
    env = gymnasium.make("steptp_env/StepTP-model-v1", workload="level1/matmul", preset="tiny")
    assert env.unwrapped.mode == "model" and env.unwrapped.metadata["deterministic"] is True
    env.close()
    assert gymnasium.spec("steptp_env/StepTP-measure-v1").kwargs == {"mode": "measure"}
    assert StepTPEnv.__init__.__defaults__  # the plain id takes its mode from the arguments


@pytest.mark.parametrize("env_id", ["steptp_env/StepTP-v0", "steptp_env/StepTP-hybrid-v0"])
def test_retired_v0_ids_refuse_with_the_reason(env_id):
    """v0 indices meant the first release's menus: a v0 id must not silently give them new meanings."""
    with pytest.raises(StepTPError, match="StepTP-v1"):
        gymnasium.make(env_id, workload="level1/matmul", preset="tiny")


def test_misuse_raises(tmp_path):
    with pytest.raises(ValueError):
        make(tmp_path, mode="fast")
    with pytest.raises(ValueError):
        make(tmp_path, action_mode="both")
    env = make(tmp_path)
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step(0)


def test_mask_is_exactly_the_applicable_actions(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=0)
    mask = env.action_masks()
    assert mask[STOP] and mask.dtype == bool and mask.shape == (env.catalog.size,)
    before = env.program.leir
    for index in np.flatnonzero(mask)[1:]:
        action = env.catalog.decode(int(index), env.groups)
        assert action is not None and action.strategy == env.catalog.describe(int(index)).split("#")[0]
    for index in np.flatnonzero(~mask)[:50]:
        _, reward, _, _, info = env.step(int(index))
        assert info["error"] and "masked out" in info["error"] and reward == env.penalty
        assert env.program.leir == before


def test_rewards_telescope_to_the_log_speedup(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    total = 0.0
    for _ in range(6):
        legal = np.flatnonzero(env.action_masks()[1:]) + 1
        _, reward, _, _, info = env.step(int(rng.choice(legal)))
        total += reward if info["error"] is None else 0.0
    assert math.isclose(total, math.log(env.initial_s / env.runtime_s), rel_tol=1e-9, abs_tol=1e-12)
    assert info["speedup"] == pytest.approx(env.initial_s / env.runtime_s)
    _, reward, terminated, _, info = env.step(STOP)
    assert terminated and reward == 0.0 and info["error"] is None


def _garbage(rng: np.random.Generator, env: StepTPEnv) -> object:
    """Something a bad policy or a confused LLM might send. (Programs that are valid LEIR but compute
    something else cost a build each; test_text_mode_forms and test_validate_catches_a_wrong_step send
    those.)"""
    leir = env.program.leir
    choices = [
        lambda: int(rng.integers(-5, 0)), lambda: env.catalog.size + int(rng.integers(0, 9)), lambda: 2.5,
        lambda: None, lambda: "", lambda: "loop_split(", lambda: "loop_split(nest=99, loop=c, factor=2)",
        lambda: "loop_split(nest=0, loop=zz, factor=3)", lambda: "loop_split(nest=0, loop=a, factor=7)",
        lambda: "no_such_strategy(nest=0)", lambda: "cache_read_write(nest=0, tensor=NOPE, mode=read, scope=l)",
        lambda: "online_softmax(nest=0)", lambda: '{"transformed_IR": 3}', lambda: "{not json",
        lambda: json.dumps({"transformed_IR": leir.replace("[", "(", 1), "applied_strategy": "loop_split"}),
        lambda: json.dumps({"transformed_IR": leir.replace("}_{a,", "}_{", 1), "applied_strategy": "loop_split"}),
        lambda: json.dumps({"transformed_IR": leir.replace("A^", "Q^", 1), "applied_strategy": "x"}),
        lambda: "<think>hmm</think><answer>" + json.dumps({"transformed_IR": leir[:-3]}) + "</answer>",
        lambda: "".join(chr(int(c)) for c in rng.integers(32, 127, 40)),
    ]
    return choices[int(rng.integers(len(choices)))]()


@pytest.mark.parametrize("action_mode", ["index", "text"])
def test_fuzz_never_raises_and_rejections_keep_the_state(tmp_path, action_mode):
    """1,000 actions per action mode (2,000 in all) over 10 workloads: legal ones mixed with garbage."""
    rng = np.random.default_rng(7)
    rejected = 0
    for uri in TINY:
        env = make(tmp_path, uri, action_mode=action_mode, max_steps=1000)
        env.reset(seed=0)
        for _ in range(100):
            before = env.program.leir
            if rng.random() < 0.15:  # a legal step now and then, so the fuzzing sees transformed programs
                legal = np.flatnonzero(env.action_masks()[1:]) + 1
                action = int(rng.choice(legal)) if len(legal) else STOP
                action = action if action_mode == "index" else env.catalog.decode(action, env.groups).text
            else:
                action = _garbage(rng, env)
                if action_mode == "index" and isinstance(action, str):
                    action = int(rng.choice(np.flatnonzero(~env.action_masks())))
            _, reward, terminated, _, info = env.step(action)
            if info["error"] is not None:
                rejected += 1
                assert isinstance(info["error"], str) and len(info["error"]) > 10
                assert env.program.leir == before and reward == env.penalty
            if terminated:
                env.reset(seed=1)
    assert rejected > 700


def test_text_mode_forms(tmp_path):
    env = make(tmp_path, "level1/matmul", action_mode="text", obs_mode="text")
    obs, info = env.reset(seed=0)
    assert obs["leir"] == info["leir"] and "loop_split" in obs["candidates"]
    first = info["candidates"][0]
    _, _, _, _, info = env.step(first)
    assert info["error"] is None and info["action"] == first and info["explain"]
    # a Step-TP answer of a known strategy is labelled by identify
    env.reset(seed=0)
    split = next(c for c in info["candidates"] if c.startswith("loop_split"))
    from steptp_env.strategies import apply_action
    after = apply_action(env.program, split)
    answer = ("<think>split the loop</think><answer>" +
              json.dumps({"transformed_IR": after.leir, "applied_strategy": "loop_split"}) + "</answer>")
    _, _, _, _, info = env.step(answer)
    assert info["error"] is None and info["action"].startswith("loop_split") and info["identified"]
    # an equivalent rewrite no strategy explains is accepted after verification, flagged unidentified
    env.reset(seed=0)
    rewrite = env.program.leir.replace("*", "*1.0*", 1)
    assert rewrite != env.program.leir
    _, _, _, _, info = env.step(json.dumps({"transformed_IR": rewrite, "applied_strategy": "free"}))
    assert info["error"] is None and info["identified"] is False and env.state.actions[0].startswith("leir:")
    # a wrong one is rejected by verification
    env.reset(seed=0)
    wrong = env.program.leir.replace("*", "+", 1)
    _, reward, _, _, info = env.step(json.dumps({"transformed_IR": wrong, "applied_strategy": "free"}))
    assert info["error"] and "equivalent" in info["error"] and reward == env.penalty


def test_state_replays_and_validates(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(10):
        legal = np.flatnonzero(env.action_masks()[1:]) + 1
        env.step(int(rng.choice(legal)))
    state = env.state
    assert len(state.actions) >= 5
    path = state.save(tmp_path / "run" / "state.json")
    loaded = EnvState.load(path)
    assert loaded == state
    other = make(tmp_path, "level1/matmul")
    other.apply(loaded)
    assert other.program.leir == env.program.leir
    assert other.state.rewards == pytest.approx(state.rewards)
    report = other.validate(loaded)
    assert report["ok"], report["errors"]
    assert report["final_leir"] == env.program.leir and report["speedup"] > 0


def test_validate_catches_a_wrong_step(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=0)
    state = env.state
    state.actions.append("leir:" + env.program.leir.replace("*", "+", 1))
    report = env.validate(state)
    assert not report["ok"] and "step 1" in report["errors"][0]


def test_fork_is_independent_and_shares_the_oracle(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=0)
    twin = env.fork()
    legal = int(np.flatnonzero(env.action_masks()[1:])[0] + 1)
    twin.step(legal)
    assert twin.program.leir != env.program.leir and env.state.actions == []
    assert twin.oracle is env.oracle


def test_workload_sampling_and_switching(tmp_path):
    env = StepTPEnv("level1/*softmax*", preset="tiny", mode="model", store=tmp_path / "s.sqlite")
    seen = {env.reset(seed=s)[1]["workload"] for s in range(6)}
    assert len(seen) > 1 and all("softmax" in u for u in seen)
    _, info = env.reset(options={"workload": "level1/relu"})
    assert info["workload"] == "level1/relu"


def test_from_torch_workload_replays_from_saved_files(tmp_path):
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.relu(x @ self.w)

    torch.manual_seed(0)
    wl = from_torch(Scale(), torch.randn(4, 8))
    assert wl.uri.startswith("torch/")
    env = StepTPEnv(wl, mode="model", store=tmp_path / "s.sqlite")
    env.reset(seed=0)
    env.step(int(np.flatnonzero(env.action_masks()[1:])[0] + 1))
    state = env.state
    wl.save(tmp_path / "workload")
    loaded = Workload.load(tmp_path / "workload")
    again = StepTPEnv(loaded, mode="model", store=tmp_path / "s.sqlite")
    again.apply(state)
    assert again.program.leir == env.program.leir
    assert again.validate(state)["ok"]


def _random_masked_actions(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([int(rng.choice(np.flatnonzero(m))) for m in masks])


def test_async_vector_env_runs(tmp_path):
    store = str(tmp_path / "shared.sqlite")
    fns = [lambda u=u: gymnasium.make("steptp_env/StepTP-v1", workload=u, preset="tiny", mode="model", store=store,
                                      max_steps=8) for u in TINY[:4]]
    envs = gymnasium.vector.AsyncVectorEnv(fns)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        obs, rewards, _, _, _ = envs.step(_random_masked_actions(obs["action_mask"].astype(bool), rng))
        assert np.isfinite(rewards).all()
    envs.close()


def test_sb3_subproc_vec_env_runs(tmp_path):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    store = str(tmp_path / "shared.sqlite")
    fns = [lambda u=u: StepTPEnv(u, preset="tiny", mode="model", store=store, max_steps=8) for u in TINY[:2]]
    envs = SubprocVecEnv(fns)
    envs.seed(0)
    obs = envs.reset()
    rng = np.random.default_rng(0)
    for _ in range(300):
        masks = np.stack(envs.env_method("action_masks"))
        obs, rewards, _, _ = envs.step(_random_masked_actions(masks, rng))
        assert np.isfinite(rewards).all()
    envs.close()


def test_measure_mode_replay_hits_the_store(tmp_path):
    """A second env on the same store measures nothing: every runtime of the replayed episode is a store
    hit with the same value, so rewards are identical."""
    def run(actions=None):
        env = make(tmp_path, "level1/relu", mode="measure")
        env.reset(seed=3)
        rng = np.random.default_rng(3)
        taken, rewards, sources = [], [], []
        for number in range(4):
            action = actions[number] if actions else int(rng.choice(np.flatnonzero(env.action_masks()[1:]) + 1))
            _, reward, _, _, info = env.step(action)
            taken.append(action)
            rewards.append(reward)
            sources.append(info.get("runtime_source"))
        return taken, rewards, sources, env

    taken, rewards, sources, first = run()
    assert "measured" in sources and first.oracle.counts["measured"] >= 2
    _, again, sources2, second = run(taken)
    assert again == rewards and second.oracle.counts["measured"] == 0
    assert set(sources2) <= {"stored", None} and second.oracle.counts["stored"] >= 2


def test_candidate_lists_persist_in_the_store(tmp_path, monkeypatch):
    """Lists written with a program come back equal (tuple parameters included) in a process whose
    memory cache is cold, are read rather than recomputed, and are keyed by the code's digest."""
    from steptp_env.env import catalog
    from steptp_env.measure import ResultStore
    from steptp_env.workloads import get_workload

    store = ResultStore(tmp_path / "store.sqlite")
    program = get_workload("level1/layer_norm", preset="tiny").program
    computed = catalog.candidate_groups(program, "llvm", store)
    assert any(isinstance(v, tuple) for found in computed.values() for a in found for _, v in a.params)
    monkeypatch.setattr(catalog, "_GROUPS", type(catalog._GROUPS)())
    assert catalog.candidate_groups(program, "llvm", store) == computed
    (count,) = store._conn.execute("SELECT COUNT(*) FROM candidates").fetchone()
    assert count == 1

    monkeypatch.setattr(catalog, "_GROUPS", type(catalog._GROUPS)())
    store.put_candidates(catalog._stored_key(program, "llvm"), json.dumps({"loop_split": []}))
    assert catalog.candidate_groups(program, "llvm", store) == {"loop_split": []}

    monkeypatch.setattr(catalog, "_GROUPS", type(catalog._GROUPS)())
    monkeypatch.setattr(catalog, "code_digest", lambda: "another version")
    assert catalog.candidate_groups(program, "llvm", store) == computed
    (count,) = store._conn.execute("SELECT COUNT(*) FROM candidates").fetchone()
    assert count == 2


def test_actions_off_the_candidate_menu_are_verified_in_model_mode(tmp_path):
    """The bulk verification covers candidates only, so a text action whose parameters the menu does not
    offer (here the guard the analysis proves unnecessary) is verified before it is accepted; a candidate
    is not (model mode stays build-free)."""
    env = make(tmp_path, "level1/softmax")
    env.reset(seed=0)
    assert "online_softmax(nest=1, guard=1, state=scan)" not in env.candidate_texts()
    _, _, _, _, info = env.step("online_softmax(nest=1, guard=1, state=scan)")
    assert info["error"] is None and info["verified"] is True
    env.reset(seed=0)
    _, _, _, _, info = env.step("online_softmax(nest=1, guard=0, state=scan)")
    assert info["error"] is None and info["verified"] is False
