"""Cost model: features of real programs, a real XGBoost ensemble, the literature's metrics."""
from __future__ import annotations

import numpy as np
import pytest

from steptp_env.costmodel import CostModel, a_peak_at_k, features, kendall_tau, leir_features, p_rmse, \
    pairwise_accuracy
from steptp_env.costmodel.features import SIZE
from steptp_env.workloads import get_workload


@pytest.fixture(scope="module")
def programs():
    return [get_workload(uri, preset="tiny").program for uri in
            ("level1/softmax", "level1/matmul_square", "level1/conv2d_square_input_square_kernel", "level1/layer_norm")]


def test_features_have_a_fixed_size_and_are_deterministic(programs):
    rows = [features(p) for p in programs]
    assert all(r.shape == (SIZE,) and np.isfinite(r).all() for r in rows)
    assert np.array_equal(rows[0], features(programs[0]))
    assert len({r.tobytes() for r in rows}) == len(rows)


def test_leir_features_see_loop_kinds_and_sizes(programs):
    from steptp_env import Program

    sig = [{"name": "A", "shape": [64, 64], "dtype": "float32"},
           {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "output"}]
    serial = leir_features(Program.parse("L^{64}_{a=0}L^{64}_{c=0}[C^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c});];", sig))
    parallel = leir_features(Program.parse("P^{64}_{a=0}V^{64}_{c=0}[C^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c});];", sig))
    assert serial[9] == 2 and parallel[10] == 1 and parallel[11] == 1  # loops_L, loops_P, loops_V
    assert serial[14] == 1.0  # the innermost loop is unit-stride with an extent that vectors divide


def synthetic(n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, SIZE)).astype(np.float32)
    runtime = np.exp(3 * X[:, 0] - 2 * X[:, 1] + 0.05 * rng.standard_normal(n)) * 1e-3
    return X, runtime


def test_model_learns_ranks_and_reports_uncertainty(tmp_path):
    X, y = synthetic(400, 0)
    model = CostModel(members=3, seed=0).fit(X[:300], y[:300])
    pred, spread = model.predict(X[300:])
    groups = ["a"] * 50 + ["b"] * 50
    assert pairwise_accuracy(pred, y[300:], groups) > 0.85
    assert kendall_tau(pred, y[300:], groups) > 0.7
    assert spread.shape == (100,) and (spread >= 0).all() and spread.mean() > 0
    far = model.predict(np.full((1, SIZE), 5.0, np.float32))[1]  # far outside the data: still finite
    assert np.isfinite(far).all()
    model.save(tmp_path / "m")
    again = CostModel.load(tmp_path / "m")
    np.testing.assert_allclose(again.predict(X[300:])[0], pred)
    assert again.meta["feature_version"] >= 1 and "cores" in again.meta["machine"]


def test_online_updates_retrain_after_twenty_percent_growth():
    X, y = synthetic(200, 1)
    model = CostModel(members=2).fit(X[:100], y[:100])
    assert not model.update(X[100:110], y[100:110])  # 10% more: keep the old boosters
    assert model.update(X[110:130], y[110:130])  # 30% more than at the last fit: retrain
    assert model.fitted_on == 130


def test_metrics_on_hand_computed_cases():
    true = [1.0, 2.0, 4.0, 1.0, 3.0]
    groups = ["x", "x", "x", "y", "y"]
    perfect = a_peak_at_k(true, true, groups, k=1)
    wrong = a_peak_at_k([3.0, 2.0, 1.0, 2.0, 1.0], true, groups, k=1)
    assert perfect == 1.0 and wrong == pytest.approx((1 / 4 + 1 / 3) / 2)
    assert p_rmse(true, true, groups) == 0.0
    assert pairwise_accuracy([1, 2, 3, 1, 2], true, groups) == 1.0
    assert pairwise_accuracy([3, 2, 1, 2, 1], true, groups) == 0.0
    close = [1.0, 1.03, 2.0]  # the first two are within 5% of each other
    assert pairwise_accuracy([2, 1, 3], close, ["x"] * 3) == pytest.approx(2 / 3)
    assert pairwise_accuracy([2, 1, 3], close, ["x"] * 3, tie=0.05) == 1.0
    assert kendall_tau([1, 2, 3, 0, 0], true, groups) == pytest.approx(1.0)


def test_the_packaged_model_loads_names_its_hardware_and_predicts():
    from steptp_env.costmodel import default_model, features
    from steptp_env.workloads import get_workload

    model = default_model()
    assert model.trained and model.meta["machine"] and model.meta["protocol"] and model.meta["samples"] >= 2000
    runtime, spread = model.predict(features(get_workload("level1/softmax", preset="small").program)[None])
    assert 1e-7 < runtime[0] < 10 and spread[0] >= 0
