"""An XGBoost model of log runtime, bagged for an uncertainty estimate, updated online.

`predict` returns runtimes and the spread (standard deviation in log space) of the ensemble members: the
environment's hybrid mode measures when that spread says the model is unsure. As in MetaSchedule, the
model retrains when its data has grown by a fifth since the last fit.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import xgboost

from ..measure.context import machine_description
from .features import FEATURE_VERSION, SIZE

PARAMS = {"max_depth": 8, "eta": 0.15, "subsample": 0.9, "colsample_bytree": 0.8, "min_child_weight": 1,
          "objective": "reg:squarederror", "nthread": 1}
ROUNDS = 200


class CostModel:
    """Predicts runtimes (seconds) from `features.features` vectors."""

    def __init__(self, members: int = 5, seed: int = 0, retrain_growth: float = 0.2) -> None:
        self.members = members
        self.seed = seed
        self.retrain_growth = retrain_growth
        self.boosters: list[xgboost.Booster] = []
        self.X = np.zeros((0, SIZE), np.float32)
        self.y = np.zeros(0, np.float64)  # log seconds
        self.fitted_on = 0
        self.meta: dict = {}
        self.frozen = False
        self.sample_keys: set[str] = set()

    @property
    def trained(self) -> bool:
        return bool(self.boosters)

    @property
    def threads(self) -> int | None:
        """The thread count of the protocol its training timings were taken under (`meta["protocol"]`), or
        None where that was not recorded: predictions are runtimes under that protocol only."""
        match = re.search(r"threads=(\d+)", str(self.meta.get("protocol") or ""))
        return int(match.group(1)) if match else None

    def fit(self, X: np.ndarray, runtimes_s: Sequence[float]) -> CostModel:
        """Train from scratch on these samples (kept as the model's data)."""
        self.X = np.asarray(X, np.float32).reshape(-1, SIZE)
        self.y = np.log(np.asarray(runtimes_s, np.float64))
        self._train()
        return self

    def update(self, X: np.ndarray, runtimes_s: Sequence[float], keys: Sequence[str] | None = None) -> bool:
        """Add samples; retrain when the data grew by `retrain_growth` since the last fit. Returns whether
        it retrained. With `keys` (one per row, e.g. a store record's key), a sample already added under its
        key is not added again: environments sharing a model meet the same stored records. A frozen model
        (the packaged one, shared by every model-mode environment of a process) refuses: learn on a
        `copy()`."""
        if self.frozen:
            raise RuntimeError("this cost model is frozen (shared, so that model-mode predictions do not change "
                               "under other environments); update a copy() instead")
        X = np.asarray(X, np.float32).reshape(-1, SIZE)
        y = np.log(np.asarray(runtimes_s, np.float64))
        if keys is not None:
            fresh = [i for i, key in enumerate(keys) if key not in self.sample_keys]
            self.sample_keys.update(keys)
            X, y = X[fresh], y[fresh]
            if not len(y):
                return False
        self.X = np.concatenate([self.X, X])
        self.y = np.concatenate([self.y, y])
        if len(self.y) >= max(2, self.fitted_on * (1 + self.retrain_growth)):
            self._train()
            return True
        return False

    def _train(self) -> None:
        rng = np.random.default_rng(self.seed)
        n = len(self.y)
        self.boosters = []
        for member in range(self.members):
            rows = rng.integers(0, n, n) if self.members > 1 else np.arange(n)
            data = xgboost.DMatrix(self.X[rows], label=self.y[rows])
            self.boosters.append(xgboost.train(dict(PARAMS, seed=self.seed + member), data, ROUNDS))
        self.fitted_on = n

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(runtimes in seconds, ensemble spread in log space) for each row."""
        if not self.trained:
            raise RuntimeError("the cost model has not been trained")
        data = np.asarray(X, np.float32).reshape(-1, SIZE)
        logs = np.stack([b.inplace_predict(data, validate_features=False) for b in self.boosters])
        return np.exp(logs.mean(0)), logs.std(0)

    def copy(self) -> CostModel:
        """An independent, unfrozen copy (boosters, data, sample keys) to learn on."""
        twin = CostModel(members=self.members, seed=self.seed, retrain_growth=self.retrain_growth)
        twin.boosters = [booster.copy() for booster in self.boosters]
        twin.X, twin.y, twin.fitted_on = self.X.copy(), self.y.copy(), self.fitted_on
        twin.meta, twin.sample_keys = dict(self.meta), set(self.sample_keys)
        return twin

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, directory: Path | str) -> Path:
        """Boosters as XGBoost UBJSON, training data as .npz, metadata (feature version, seed, hardware)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for i, booster in enumerate(self.boosters):
            booster.save_model(directory / f"member{i}.ubj")  # XGBoost's binary JSON: half the size
        np.savez_compressed(directory / "data.npz", X=self.X, y=self.y)
        meta = dict(self.meta, feature_version=FEATURE_VERSION, members=len(self.boosters), seed=self.seed,
                    samples=int(len(self.y)), machine=self.meta.get("machine") or machine_description())
        (directory / "model.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> CostModel:
        directory = Path(directory)
        meta = json.loads((directory / "model.json").read_text())
        if meta["feature_version"] != FEATURE_VERSION:
            raise RuntimeError(f"model features v{meta['feature_version']}, this code computes v{FEATURE_VERSION}")
        model = cls(members=meta["members"], seed=meta["seed"])
        model.meta = meta
        for i in range(meta["members"]):
            booster = xgboost.Booster()
            booster.load_model(directory / f"member{i}.ubj")
            booster.set_param({"nthread": 1})  # not saved with the model; more threads only contend
            model.boosters.append(booster)
        with np.load(directory / "data.npz", allow_pickle=False) as data:
            model.X, model.y = data["X"], data["y"]
        model.fitted_on = len(model.y)
        return model
