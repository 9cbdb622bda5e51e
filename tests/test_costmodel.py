"""Cost model: features of real programs, a real XGBoost ensemble, the literature's metrics."""
from __future__ import annotations

import json

import numpy as np
import pytest

from steptp_env.costmodel import CostModel, Features, FEATURE_VERSION, a_peak_at_k, features, kendall_tau, \
    p_rmse, pairwise_accuracy
from steptp_env.costmodel.features import PER_STORE, ROW_WIDTH, SIZE
from steptp_env.costmodel.loop_features import EQUATION_FEATURES, ROW_SIZE, equation_rows
from steptp_env.costmodel.model import ranking_pairs
from steptp_env.ir.ast import equations
from steptp_env.workloads import get_workload


@pytest.fixture(scope="module")
def programs():
    return [get_workload(uri, preset="tiny").program for uri in
            ("level1/softmax", "level1/matmul_square", "level1/conv2d_square_input_square_kernel", "level1/layer_norm")]


def test_features_give_rows_and_a_fixed_size_observation_deterministically(programs):
    found = [features(p) for p in programs]
    for f, p in zip(found, programs):
        stores = int((f.rows[:, 0] == 0).sum())
        assert f.rows.shape[1] == ROW_WIDTH and f.observation.shape == (SIZE,) and np.isfinite(f.observation).all()
        assert len(f.rows) - stores == sum(1 for n in p.nests for _ in equations(n))  # one row per equation
        assert stores > 0 and np.isnan(f.rows[:stores, 1 + PER_STORE:]).all()  # the other part is missing
    again = features(programs[0])
    assert np.array_equal(found[0].rows, again.rows, equal_nan=True)
    assert len({f.observation.tobytes() for f in found}) == len(found)
    restored = Features.from_json(json.loads(json.dumps(found[1].to_json())))
    assert np.array_equal(restored.rows, found[1].rows, equal_nan=True)
    assert Features.from_json(found[1].observation.tolist()) is None  # a FEATURE_VERSION 1 record: recompute


def test_equation_rows_tell_loop_orders_apart():
    from steptp_env import Program

    sig = [{"name": "A", "shape": [64, 64], "dtype": "float32"}, {"name": "B", "shape": [64, 64], "dtype": "float32"},
           {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "output"}]
    body = "[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];"
    ijk = equation_rows(Program.parse("L^{64}_{a=0}L^{64}_{c=0}L^{64}_{d=0}" + body, sig))
    ikj = equation_rows(Program.parse("L^{64}_{a=0}L^{64}_{d=0}L^{64}_{c=0}" + body, sig))
    assert ijk.shape == ikj.shape == (1, ROW_SIZE) and not np.array_equal(ijk, ikj)
    # the same features the pooled observation (and the previous model) could not tell apart
    names = dict(zip(EQUATION_FEATURES, ijk[0, -len(EQUATION_FEATURES):]))
    assert names["reduction"] == 1 and names["innermost_reduced_depth"] == 0 and names["log2_trips"] > 17
    assert dict(zip(EQUATION_FEATURES, ikj[0, -len(EQUATION_FEATURES):]))["innermost_reduced_depth"] == 1


def synthetic(n: int, seed: int):
    """Programs of 1-6 rows; runtime = sum over rows of exp(3 x0 - 2 x1) (+ noise): additive, as the model
    assumes."""
    rng = np.random.default_rng(seed)
    programs, runtimes = [], []
    for _ in range(n):
        rows = rng.uniform(0, 1, (rng.integers(1, 7), ROW_WIDTH)).astype(np.float32)
        rows[:, 0] = rng.integers(0, 2, len(rows))
        programs.append(rows)
        runtimes.append(np.exp(3 * rows[:, 1] - 2 * rows[:, 2]).sum() * 1e-3 * np.exp(0.05 * rng.standard_normal()))
    return programs, np.asarray(runtimes)


def test_model_sums_rows_learns_ranks_and_reports_uncertainty(tmp_path):
    programs, y = synthetic(400, 0)
    groups = ["a"] * 150 + ["b"] * 150
    model = CostModel(members=3, seed=0).fit(programs[:300], y[:300], groups)
    pred, spread = model.predict(programs[300:])
    test_groups = ["a"] * 50 + ["b"] * 50
    assert pairwise_accuracy(pred, y[300:], test_groups, tie=0.05) > 0.85
    assert kendall_tau(pred, y[300:], test_groups) > 0.7
    assert spread.shape == (100,) and (spread >= 0).all() and spread.mean() > 0
    twice = model.predict([np.concatenate([programs[300], programs[300]])])[0][0]
    assert twice == pytest.approx(2 * pred[0], rel=1e-4)  # a program's time is the sum of its rows'
    far = model.predict([np.full((1, ROW_WIDTH), 5.0, np.float32)])[1]  # far outside the data: still finite
    assert np.isfinite(far).all()
    model.save(tmp_path / "m")
    again = CostModel.load(tmp_path / "m")
    np.testing.assert_allclose(again.predict(programs[300:])[0], pred, rtol=1e-5)
    assert again.meta["feature_version"] == FEATURE_VERSION and "cores" in again.meta["machine"]
    assert again.groups == groups and len(again.counts) == 300


def test_ranking_pairs_stay_inside_a_workload_and_skip_near_ties():
    y = np.log(np.asarray([1.0, 1.02, 2.0, 1.0, 3.0]))
    pairs = ranking_pairs(y, ["x", "x", "x", "y", "y"], seed=0)
    assert sorted(map(tuple, pairs.tolist())) == [(0, 2), (1, 2), (3, 4)]  # (faster, slower); 0-1 are 2% apart


def test_online_updates_train_further_after_twenty_percent_growth():
    programs, y = synthetic(200, 1)
    model = CostModel(members=2).fit(programs[:100], y[:100])
    before = model.predict(programs[150:])[0]
    assert not model.update(programs[100:110], y[100:110])  # 10% more: keep the trees
    assert model.update(programs[110:130], y[110:130], keys=[str(i) for i in range(20)])  # 30% more: train on
    assert model.fitted_on == 130 and not np.allclose(model.predict(programs[150:])[0], before)
    assert not model.update(programs[110:130], y[110:130], keys=[str(i) for i in range(20)])  # known keys
    assert len(model.y) == 130


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
    runtime, spread = model.predict([features(get_workload("level1/softmax", preset="small").program).rows])
    assert 1e-7 < runtime[0] < 10 and spread[0] >= 0


def test_collect_train_export_and_the_cli_on_a_real_store(tmp_path):
    """Measured programs go into a store with their features, train a model, export as parquet with a card
    and load back to the same data; a record of the previous feature version is recomputed from its
    program, in training and in the export; `steptp costmodel export|eval` run on the store."""
    from typer.testing import CliRunner

    from steptp_env.cli import app
    from steptp_env.costmodel.dataset import collect, load_dataset, split_families, train
    from steptp_env.costmodel.export import export_dataset, load_exported
    from steptp_env.measure import Protocol, ResultStore

    uris = ["level1/relu", "level1/matmul_square"]
    with ResultStore(tmp_path / "s.sqlite") as store:
        assert collect(store, uris, 4, preset="tiny", protocol=Protocol(threads=1, repeat=2)) == 8
        assert collect(store, uris, 4, preset="tiny", protocol=Protocol(threads=1, repeat=2)) == 0  # resumed
        first = next(store.records(ok_only=True))
        store.put(first["key"], first["measurement"], first["workload"], [0.0] * SIZE)  # a v1 record
        found, y, groups = load_dataset(store)
        assert len(found) == 8 and sorted(set(groups)) == sorted(uris) and (y > 0).all()
        assert any(f.rows.shape[1] == ROW_WIDTH for f in found)
        model = train(store, members=1)
        assert model.fitted_on == 8 and model.meta["workloads"] == 2
        assert model.meta["protocol"] == Protocol(threads=1, repeat=2).key  # what the env checks threads against
        assert export_dataset(store, tmp_path / "export") == 8  # the v1 record's features computed again
        collect(store, uris[:1], 1, preset="tiny", protocol=Protocol(threads=1, repeat=3))
        with pytest.raises(ValueError, match="timings of 2 protocols"):
            train(store, members=1)  # runtimes of two protocols are not one quantity
        store.put("timed-again", dict(first["measurement"], median_s=1.0), first["workload"], None, "newer code")
        found, y_all, _ = load_dataset(store)  # 8 programs + 1 of the second protocol; the retimed one once
        assert len(found) == 9 and 1.0 in y_all and first["measurement"]["median_s"] not in y_all
    card = (tmp_path / "export" / "README.md").read_text()
    assert "8 LEIR programs of 2 " in card and '"threads": 1' in card and "(preset `tiny`)" in card
    again, y_again, groups_again = load_exported(tmp_path / "export")
    assert len(again) == 8 and set(groups_again) == set(uris)
    assert np.isin(y_again, y).all()
    train_uris, test_uris = split_families(uris, 0.5, seed=0)
    assert len(test_uris) == 1 and set(train_uris) | set(test_uris) == set(uris)

    runner = CliRunner()
    model.save(tmp_path / "m")
    result = runner.invoke(app, ["costmodel", "eval", str(tmp_path / "m"), "--store", str(tmp_path / "s.sqlite")])
    assert result.exit_code == 0 and "pairwise_accuracy" in result.output
    result = runner.invoke(app, ["costmodel", "export", str(tmp_path / "e2"), "--store", str(tmp_path / "s.sqlite")])
    assert result.exit_code == 0 and (tmp_path / "e2" / "data.parquet").exists()
    again, y_again, _ = load_exported(tmp_path / "e2")  # 10 rows: the retimed program once, as load_dataset has it
    assert len(again) == 9 and sorted(y_again) == sorted(y_all)
    empty = runner.invoke(app, ["costmodel", "export", str(tmp_path / "e3"), "--store", str(tmp_path / "none.sqlite")])
    assert empty.exit_code != 0 and "has no measured programs" in " ".join(empty.output.split())
