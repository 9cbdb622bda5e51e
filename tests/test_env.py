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
from steptp_env.env.fuzz import bad_action
from steptp_env.errors import StepTPError
from steptp_env.frontend.workload import Workload
from steptp_env.strategies import apply_action
from steptp_env.workloads import get_workload

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


def test_hybrid_mode_pays_only_for_verified_programs(tmp_path):
    """Hybrid mode (the constructor's and `make demo`'s mode), measured for real: by default every step is
    verified, measured or not; with verify_steps=False a step paid on a prediction says it was not verified
    and why. Rewards telescope in both."""
    for verify_steps in (None, False):
        env = make(tmp_path, "level1/matmul", mode="hybrid", verify_steps=verify_steps)
        env.reset(seed=1)
        assert env.runtime_s > 0 and env.oracle.counts["measured"] + env.oracle.counts["stored"] == 1
        env.best_s = 0.0  # no prediction claims a new best, so steps the model is sure of stay predicted
        rng = np.random.default_rng(1)
        sources = []
        for _ in range(4):
            legal = np.flatnonzero(env.action_masks()[1:]) + 1
            _, reward, _, _, info = env.step(int(rng.choice(legal)))
            assert info["error"] is None, info["error"]
            sources.append(info["runtime_source"])
            predicted = info["runtime_source"] == "predicted"
            assert info["verified"] is (verify_steps is None or not predicted), info
            assert ("unverified" in info) is (not info["verified"])
            if not info["verified"]:
                assert "predicted runtime" in info["unverified"] and "not checked" in info["unverified"]
        assert "predicted" in sources, sources
        assert math.isclose(sum(env.state.rewards), math.log(env.initial_s / env.runtime_s), rel_tol=1e-9)


def test_model_mode_predictions_stay_put_while_hybrid_envs_learn(tmp_path):
    """Model mode shares the frozen packaged model; hybrid environments learn on their own copy, and a sample
    met again (a store hit in another environment sharing that copy) is not added twice."""
    from steptp_env.costmodel import default_model

    shared = default_model()
    model_env = make(tmp_path, "level1/matmul")
    model_env.reset(seed=0)
    assert model_env.oracle.model is shared and shared.frozen
    with pytest.raises(RuntimeError, match="frozen"):
        shared.update([model_env.oracle.features(model_env.program).rows], [1e-3])
    programs = [model_env.program] + [model_env.catalog.decode(int(i), model_env.groups) for i in
                                      (np.flatnonzero(model_env.action_masks()[1:])[:3] + 1)]
    programs = [programs[0]] + [apply_action(programs[0], a) for a in programs[1:]]
    predicted = [model_env.oracle.predict(p).runtime_s for p in programs]
    samples = len(shared.y)

    learner = make(tmp_path, "level1/matmul", mode="hybrid", verify_steps=False)
    learner.reset(seed=0)
    assert learner.oracle.model is not shared and not learner.oracle.model.frozen
    steps = [int(i) + 1 for i in np.flatnonzero(learner.action_masks()[1:])[:3]]
    for index in steps:
        learner.reset(seed=0)
        learner.step(index)
    learned = len(learner.oracle.model.y) - samples
    assert learned == learner.oracle.counts["measured"] + learner.oracle.counts["stored"] >= 1
    twin = make(tmp_path, "level1/matmul", mode="hybrid", verify_steps=False, model=learner.oracle.model)
    for index in steps:  # the same programs: store hits now, already learned
        twin.reset(seed=0)
        twin.step(index)
    assert twin.oracle.counts["stored"] >= 1 and len(learner.oracle.model.y) - samples == learned
    assert len(shared.y) == samples
    assert [model_env.oracle.predict(p).runtime_s for p in programs] == predicted


def test_the_uncertainty_penalty_takes_the_spread_off_predicted_rewards(tmp_path):
    plain, careful = make(tmp_path, "level1/matmul"), make(tmp_path, "level1/matmul", uncertainty_penalty=2.0)
    plain.reset(seed=0)
    careful.reset(seed=0)
    action = int(np.flatnonzero(plain.action_masks()[1:])[0]) + 1
    _, reward, _, _, info = plain.step(action)
    _, penalised, _, _, careful_info = careful.step(action)
    assert info["spread"] > 0 and "uncertainty_penalty" not in info
    assert careful_info["uncertainty_penalty"] == pytest.approx(2.0 * info["spread"])
    assert penalised == pytest.approx(reward - 2.0 * info["spread"])
    with pytest.raises(ValueError, match="uncertainty_penalty"):
        make(tmp_path, "level1/matmul", uncertainty_penalty=-1)


def test_the_protocol_is_the_cost_models(tmp_path):
    """Where a model predicts, the protocol is the one its timings were taken under (1 thread for the
    packaged model) and another is refused; measure mode takes any, all cores by default."""
    import os

    from steptp_env.measure import Protocol

    env = make(tmp_path, "level1/matmul")
    assert env.oracle.protocol.threads == env.oracle.model.threads == 1
    for mode in ("model", "hybrid"):
        with pytest.raises(ValueError, match="trained on timings at 1 thread"):
            make(tmp_path, "level1/matmul", mode=mode, protocol=Protocol(threads=2))
    assert make(tmp_path, "level1/matmul", mode="measure").oracle.protocol.threads == (os.cpu_count() or 1)
    assert make(tmp_path, "level1/matmul", mode="measure", protocol=Protocol(threads=2)).oracle.protocol.threads == 2


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
                action = bad_action(rng, env)
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


class _Injected(RuntimeError):
    pass


def _raise(*args, **kwargs):
    raise _Injected("injected failure")


@pytest.mark.parametrize("where", ["enumeration", "explanation", "prediction"])
def test_a_failure_after_the_action_is_undone(tmp_path, monkeypatch, where):
    """A failure after the action was read (enumerating the new program's candidates, explaining the step,
    the hybrid calibration's prediction) undoes the step: penalty, the reason in info, the state as before,
    and the next step works."""
    from steptp_env.env import catalog
    from steptp_env.env.runtime import Estimate
    from steptp_env.strategies import REGISTRY

    env = make(tmp_path, "level1/matmul", mode="hybrid" if where == "prediction" else "model")
    env.reset(seed=0)
    action = int(np.flatnonzero(env.action_masks()[1:])[0]) + 1
    text = env.action_text(action)
    strategy = REGISTRY[text.split("(")[0]]
    before = (env.program.leir, env.runtime_s, env.best_s, list(env.state.actions), list(env.state.rewards))
    with monkeypatch.context() as patch:
        if where == "enumeration":  # the new program's menus are computed afresh (no remembered lists)
            patch.setattr(catalog, "_GROUPS", type(catalog._GROUPS)())
            patch.setattr(type(REGISTRY["loop_reorder"]), "candidates", _raise)
            patch.setattr(type(REGISTRY["loop_reorder"]), "nest_candidates", _raise)
        elif where == "explanation":
            patch.setattr(type(strategy), "explain", _raise)
        else:
            patch.setattr(type(env.oracle), "predict", _raise)
            # a measured runtime without timing anything: the calibration then asks the model for a prediction
            patch.setattr(type(env.oracle), "runtime", lambda *a, **k: Estimate(env.runtime_s / 2, "measured"))
        _, reward, terminated, _, info = env.step(action)
    assert "injected failure" in info["error"] and "undone" in info["error"], info["error"]
    assert reward == env.penalty and not terminated
    assert (env.program.leir, env.runtime_s, env.best_s, list(env.state.actions), list(env.state.rewards)) == before
    _, reward, _, _, info = env.step(action)
    assert info["error"] is None and env.state.actions == [text]


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
    assert info["claimed_strategy_matches"] is True
    # an equivalent rewrite no strategy explains is accepted after verification, flagged unidentified
    env.reset(seed=0)
    rewrite = env.program.leir.replace("*", "*1.0*", 1)
    assert rewrite != env.program.leir
    _, _, _, _, info = env.step(json.dumps({"transformed_IR": rewrite, "applied_strategy": "free"}))
    assert info["error"] is None and info["identified"] is False and env.state.actions[0].startswith("leir:")
    assert info["claimed_strategy_matches"] is False
    # a wrong one is rejected by verification
    env.reset(seed=0)
    wrong = env.program.leir.replace("*", "+", 1)
    _, reward, _, _, info = env.step(json.dumps({"transformed_IR": wrong, "applied_strategy": "free"}))
    assert info["error"] and "equivalent" in info["error"] and reward == env.penalty


def test_an_answer_claiming_another_strategy_is_flagged_and_can_be_penalised(tmp_path):
    env = make(tmp_path, "level1/matmul", action_mode="text", claim_penalty=0.5)
    _, info = env.reset(seed=0)
    split = next(c for c in info["candidates"] if c.startswith("loop_split"))
    leir = apply_action(env.program, split).leir
    rewards = {}
    for claim in ("loop_split", "loop_tiling", "loop_tiling,loop_split", None):
        env.reset(seed=0)
        answer = {"transformed_IR": leir} if claim is None else {"transformed_IR": leir, "applied_strategy": claim}
        _, rewards[claim], _, _, info = env.step(json.dumps(answer))
        assert info["error"] is None and info["action"] == split and info["identified"]
        assert info.get("claimed_strategy_matches") is {"loop_tiling": False, None: None}.get(claim, True)
        assert ("claim_penalty" in info) is (claim == "loop_tiling")
    assert rewards["loop_tiling"] == pytest.approx(rewards["loop_split"] - 0.5)
    assert rewards[None] == rewards["loop_split"] == rewards["loop_tiling,loop_split"]
    with pytest.raises(ValueError, match="claim_penalty"):
        make(tmp_path, "level1/matmul", claim_penalty=-1)


def test_errors_show_numpy_values_as_python_values(tmp_path):
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=0)
    info = env.step(np.float64(1.5))[4]
    assert info["error"] == "index mode expects an integer action, got 1.5"
    info = env.step(np.array([1, 2]))[4]
    assert "np." not in info["error"] and "[1, 2]" in info["error"]
    env = make(tmp_path, "level1/matmul", action_mode="text", verify_steps=True)
    env.reset(seed=0)
    info = env.step(json.dumps({"transformed_IR": env.program.leir.replace("*", "+", 1)}))[4]
    assert "equivalent" in info["error"] and "np.float" not in info["error"], info["error"]


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
    low, high = report["speedup_interval"]
    assert low <= report["speedup"] <= high  # timed paired against the start
    env.reset(seed=3)  # an episode that stops at once ends at its start: x1 by definition, nothing timed
    assert other.validate(env.state)["speedup"] == 1.0 and other.validate(env.state)["speedup_interval"] == [1.0, 1.0]


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


def test_a_saved_workload_folder_is_accepted_where_a_uri_is(tmp_path):
    torch.manual_seed(1)
    wl = from_torch(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.randn(4, 8))
    folder = wl.save(tmp_path / "saved")
    loaded = get_workload(str(folder))
    assert loaded.uri == wl.uri and loaded.program.leir == wl.program.leir
    with pytest.raises(StepTPError, match="is float32, not float64"):
        get_workload(folder, dtype="float64")
    with pytest.raises(StepTPError, match="not a saved workload"):
        Workload.load(tmp_path)
    env = StepTPEnv(folder, mode="model", store=tmp_path / "s.sqlite")
    _, info = env.reset(seed=0)
    assert info["workload"] == wl.uri and env.program.leir == wl.program.leir
    env.step(int(np.flatnonzero(env.action_masks()[1:])[0] + 1))
    again = StepTPEnv(str(folder), mode="model", store=tmp_path / "s.sqlite")
    again.apply(env.state)
    assert again.program.leir == env.program.leir and again.validate(env.state)["ok"]
    with pytest.raises(ValueError, match="its saved folder as the workload"):
        StepTPEnv("level1/relu", preset="tiny", mode="model", store=tmp_path / "s.sqlite").apply(env.state)


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


def test_measured_rewards_are_paired_timings_and_replay_from_the_store(tmp_path):
    """In measure mode each step's program is timed interleaved with the previous one: the reward is the log
    of that ratio and the new runtime the previous one divided by it (so rewards still telescope); the pair
    is stored, so a replay on the same store times nothing and pays the same rewards."""
    def run(actions=None):
        env = make(tmp_path, "level1/matmul", mode="measure")
        env.reset(seed=2)
        rng = np.random.default_rng(2)
        taken, infos = [], []
        for number in range(3):
            action = actions[number] if actions else int(rng.choice(np.flatnonzero(env.action_masks()[1:]) + 1))
            before = env.runtime_s
            _, reward, _, _, info = env.step(action)
            assert info["error"] is None, info["error"]
            pair = info["paired"]
            assert pair["against"] == "previous" and pair["rounds"] >= 8 and pair["error"] is None
            assert pair["low"] <= pair["ratio"] <= pair["high"] and info["measured_runtime_s"] > 0
            assert reward == pytest.approx(math.log(pair["ratio"]), abs=1e-12)
            assert env.runtime_s == pytest.approx(before / pair["ratio"], rel=1e-12)
            taken.append(action)
            infos.append(info)
        assert math.isclose(sum(env.state.rewards), math.log(env.initial_s / env.runtime_s), rel_tol=1e-9)
        return taken, env

    taken, first = run()
    assert first.oracle.counts["paired"] == 3
    _, second = run(taken)
    assert second.state.rewards == first.state.rewards
    assert second.oracle.counts["paired"] == 0 and second.oracle.counts["stored pairs"] == 3


def test_unpaired_rewards_and_a_failed_pair_fall_back_to_separate_medians(tmp_path, monkeypatch):
    from steptp_env.measure import PairedTiming

    env = make(tmp_path, "level1/relu", mode="measure", paired_rewards=False)
    env.reset(seed=0)
    before = env.runtime_s
    _, reward, _, _, info = env.step(int(np.flatnonzero(env.action_masks()[1:])[0]) + 1)
    assert "paired" not in info and env.oracle.counts["paired"] == 0
    assert reward == pytest.approx(math.log(before / info["runtime_s"]))

    env = make(tmp_path, "level1/relu", mode="measure")
    env.reset(seed=0)
    monkeypatch.setattr(env.oracle, "pair", lambda *a: PairedTiming(error="build failed: injected"))
    before = env.runtime_s
    _, reward, _, _, info = env.step(int(np.flatnonzero(env.action_masks()[1:])[0]) + 1)
    assert info["error"] is None and "separately measured" in info["paired"]["fallback"]
    assert info["paired"]["error"] == "build failed: injected" and info["runtime_s"] == info["measured_runtime_s"]
    assert reward == pytest.approx(math.log(before / info["runtime_s"]))


def test_steps_back_to_a_visited_program_or_changing_nothing_are_refused_and_masked(tmp_path):
    """Undo-and-redo loops cannot farm rewards: a step leading back to a program of the episode (up to
    fresh names), or changing nothing, is refused in every action form and masked in that state from then
    on; revisits='mask' masks them all up front; revisits='allow' permits them."""
    env = make(tmp_path, "level1/matmul")
    env.reset(seed=0)
    start = env.program
    forward = next(t for t in env.candidate_texts() if t.startswith("loop_reorder"))
    _, _, _, _, info = env.step(forward)
    assert info["error"] is None
    undo = [a for acts in env.groups.values() for a in acts if apply_action(env.program, a).leir == start.leir]
    assert undo, "the menu has the inverse reorder"
    index = env.catalog.encode(undo[0], env.groups)
    assert index is not None and env.action_masks()[index]  # not known yet: nothing applied it
    for attempt in (index, undo[0].text, json.dumps({"transformed_IR": start.leir}),
                    json.dumps({"transformed_IR": env.program.leir})):  # back, or nothing changed
        before = list(env.state.actions)
        _, reward, _, _, info = env.step(attempt)
        assert "already visited or changes nothing" in info["error"] and reward == env.penalty
        assert env.state.actions == before
    assert not env.action_masks()[index] and undo[0].text not in env.candidate_texts()

    ahead = make(tmp_path, "level1/matmul", revisits="mask")
    ahead.reset(seed=0)
    ahead.step(forward)
    masked = {int(i) for i in np.flatnonzero(~ahead.action_masks())} & {
        env.catalog.encode(a, ahead.groups) for a in undo}
    assert masked == {env.catalog.encode(a, ahead.groups) for a in undo} - {None}
    legal = np.flatnonzero(ahead.action_masks()[1:]) + 1
    assert all(apply_action(ahead.program, ahead.action_text(int(i))).leir != start.leir for i in legal)

    free = make(tmp_path, "level1/matmul", revisits="allow")
    free.reset(seed=0)
    free.step(forward)
    assert free.action_masks()[index]
    _, _, _, _, info = free.step(undo[0].text)
    assert info["error"] is None and free.program.leir == start.leir
    with pytest.raises(ValueError, match="revisits"):
        make(tmp_path, revisits="never")


FUZZ_FOUND = [  # level2/conv3d_mish_tanh at tiny: benchmarks/fuzz_env.py found its replay reaching another text
    'tensor_split_to_decouple_operators(nest=2, loop=g, at=1, tensors=[E])',
    'loop_split(nest=8, loop=c, factor=2)',
    'expression_splitting(nest=8, term=[0], dims=[h,c,d,f,g], loops=[h,c,d,f,g])',
    'loop_fusion(nest=2, loops=[a,c])',
    'expression_splitting(nest=5, term=[0,1,1,1,0], dims=[c,d,f,g], loops=[c,d,f,g])',
    'loop_parallelization(nest=10, loop=h)',
    'expression_splitting(nest=9, term=[0,1,1], dims=[h,c,d,f,g], loops=[h,c,d,f,g])',
    'cache_read_write(nest=0, tensor=E, mode=write, scope=l, at=f)',
    'loop_split(nest=6, loop=d, factor=2)',
]


def test_an_identified_answer_becomes_the_program_its_label_replays_to(tmp_path):
    """A Step-TP answer is recorded as the action identify labels it with, so the env's program is what that
    action gives, not the answer as parsed: the two are the same program, but the parsed one keeps the
    parentheses of its text, and after a later split moves such a term to the top of an equation the texts
    differ (`(exp(2*F)+1)`), so the recorded episode replayed to another LEIR text."""
    env = make(tmp_path, "level2/conv3d_mish_tanh", action_mode="text", max_steps=50)
    env.reset(seed=0)
    for text in FUZZ_FOUND:
        _, _, _, _, info = env.step(json.dumps({"transformed_IR": apply_action(env.program, text).leir}))
        assert info["error"] is None and info["action"] == text, info["error"]
    replay = make(tmp_path, "level2/conv3d_mish_tanh", max_steps=50)
    replay.apply(env.state)
    assert replay.program.leir == env.program.leir
