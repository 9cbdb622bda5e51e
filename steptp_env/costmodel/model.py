"""An XGBoost model of runtime as a sum over a program's rows, bagged for an uncertainty estimate, updated
online.

Each row (a buffer store of the lowered module or a LEIR equation, `features.Features.rows`) gets a score
f; the program's predicted runtime is sum(exp(f)) over its rows, so a program's time is the sum of its
parts' times, as in MetaSchedule's XGBoost model (which sums per-store scores). The trees are fitted with
a custom objective on log(sum exp f): squared error against the measured log runtime, plus a pairwise
logistic ranking loss between programs of the same workload that are more than `RANK_MARGIN` apart
(weight `rank_weight`), since what a search needs first is the order of a workload's programs.

`predict` returns runtimes and the spread (standard deviation of log runtime) of the ensemble members:
the environment's hybrid mode measures when that spread says the model is unsure. The model adds
`ONLINE_ROUNDS` boosting rounds on all its data whenever the data has grown by a fifth since it last
trained.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import xgboost

from ..measure.context import machine_description
from .features import FEATURE_VERSION, ROW_WIDTH

PARAMS = {"max_depth": 6, "eta": 0.1, "subsample": 0.9, "colsample_bytree": 0.6, "min_child_weight": 0.5,
          "max_bin": 64, "lambda": 1.0, "tree_method": "hist", "nthread": 1, "disable_default_eval_metric": 1}
ROUNDS = 200
ONLINE_ROUNDS = 30
RANK_MARGIN = float(np.log(1.05))
PAIRS_PER_PROGRAM = 20  # ranking pairs sampled per program of a workload (all pairs for small workloads)


def _starts(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _program_scores(margins: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log sum exp of each program's row margins, each row's share of its program's sum)."""
    starts = _starts(counts)
    owner = np.repeat(np.arange(len(counts)), counts)
    top = np.maximum.reduceat(margins, starts)
    weights = np.exp(margins - top[owner])
    totals = np.add.reduceat(weights, starts)
    return top + np.log(totals), weights / totals[owner]


def ranking_pairs(y: np.ndarray, groups: Sequence[str], seed: int) -> np.ndarray:
    """(faster, slower) program index pairs inside each group, runtimes more than RANK_MARGIN apart in log;
    at most PAIRS_PER_PROGRAM per program, sampled with `seed` where a group has more."""
    rng = np.random.default_rng(seed)
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    found = []
    for members in by_group.values():
        ix = np.asarray(members)
        if len(ix) < 2:
            continue
        a, b = np.triu_indices(len(ix), 1)
        a, b = ix[a], ix[b]
        apart = np.abs(y[a] - y[b]) > RANK_MARGIN
        a, b = a[apart], b[apart]
        cap = PAIRS_PER_PROGRAM * len(ix)
        if len(a) > cap:
            keep = rng.choice(len(a), cap, replace=False)
            a, b = a[keep], b[keep]
        faster = np.where(y[a] < y[b], a, b)
        slower = np.where(y[a] < y[b], b, a)
        found.append(np.stack([faster, slower], 1))
    return np.concatenate(found) if found else np.zeros((0, 2), np.int64)


def _objective(counts: np.ndarray, y: np.ndarray, pairs: np.ndarray, rank_weight: float):
    """XGBoost's custom objective for row margins: gradients and (majorising) Hessians of the program
    losses, spread over each program's rows by their share of its sum."""
    owner = np.repeat(np.arange(len(counts)), counts)
    scale = rank_weight * len(y) / max(1, len(pairs))  # the ranking loss weighs like rank_weight x the MSE

    def objective(margins: np.ndarray, _data: xgboost.DMatrix) -> tuple[np.ndarray, np.ndarray]:
        scores, share = _program_scores(margins.astype(np.float64), counts)
        grad_p = scores - y
        hess_p = np.ones_like(y)
        if len(pairs):
            gap = scores[pairs[:, 1]] - scores[pairs[:, 0]]  # should be positive: slower minus faster
            wrong = 1.0 / (1.0 + np.exp(np.clip(gap, -50, 50)))
            np.add.at(grad_p, pairs[:, 0], scale * wrong)
            np.add.at(grad_p, pairs[:, 1], -scale * wrong)
            curvature = scale * np.maximum(wrong * (1 - wrong), 1e-6)
            np.add.at(hess_p, pairs[:, 0], curvature)
            np.add.at(hess_p, pairs[:, 1], curvature)
        # d(score)/d(margin) is the row's share; by Jensen, share x hess_p majorises the row's curvature
        return grad_p[owner] * share, np.maximum(hess_p[owner] * share, 1e-9)

    return objective


class CostModel:
    """Predicts runtimes (seconds) of programs from their `Features.rows`."""

    def __init__(self, members: int = 5, seed: int = 0, retrain_growth: float = 0.2,
                 rank_weight: float = 1.0) -> None:
        self.members = members
        self.seed = seed
        self.retrain_growth = retrain_growth
        self.rank_weight = rank_weight
        self.boosters: list[xgboost.Booster] = []
        self.rows = np.zeros((0, ROW_WIDTH), np.float32)
        self.counts = np.zeros(0, np.int64)  # rows per program
        self.y = np.zeros(0, np.float64)  # log seconds per program
        self.groups: list[str] = []  # workload per program (ranking pairs stay inside one)
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

    def fit(self, programs: Sequence[np.ndarray], runtimes_s: Sequence[float],
            groups: Sequence[str] | None = None) -> CostModel:
        """Train from scratch on these programs' rows (kept as the model's data); `groups` (a workload per
        program) enable the ranking loss."""
        self.rows, self.counts = _stack(programs)
        self.y = np.log(np.asarray(runtimes_s, np.float64))
        self.groups = list(groups) if groups is not None else [""] * len(self.y)
        self._train()
        return self

    def update(self, programs: Sequence[np.ndarray], runtimes_s: Sequence[float],
               keys: Sequence[str] | None = None, groups: Sequence[str] | None = None) -> bool:
        """Add programs; train further when the data grew by `retrain_growth` since the last training.
        Returns whether it trained. With `keys` (one per program, e.g. a store record's key), a program
        already added under its key is not added again: environments sharing a model meet the same stored
        records. A frozen model (the packaged one, shared by every model-mode environment of a process)
        refuses: learn on a `copy()`."""
        if self.frozen:
            raise RuntimeError("this cost model is frozen (shared, so that model-mode predictions do not change "
                               "under other environments); update a copy() instead")
        programs = list(programs)
        y = np.log(np.asarray(runtimes_s, np.float64))
        groups = list(groups) if groups is not None else [""] * len(programs)
        if keys is not None:
            fresh = [i for i, key in enumerate(keys) if key not in self.sample_keys]
            self.sample_keys.update(keys)
            programs, y, groups = [programs[i] for i in fresh], y[fresh], [groups[i] for i in fresh]
            if not programs:
                return False
        rows, counts = _stack(programs)
        self.rows = np.concatenate([self.rows, rows])
        self.counts = np.concatenate([self.counts, counts])
        self.y = np.concatenate([self.y, y])
        self.groups += groups
        if len(self.y) >= max(2, self.fitted_on * (1 + self.retrain_growth)):
            self._train(further=self.trained)
            return True
        return False

    def _member_data(self, member: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """A bootstrap sample of programs (all of them for a single member): rows, counts, y, groups."""
        n = len(self.y)
        rng = np.random.default_rng(self.seed + member)
        chosen = rng.integers(0, n, n) if self.members > 1 else np.arange(n)
        starts = _starts(self.counts)
        rows = np.concatenate([self.rows[starts[i]:starts[i] + self.counts[i]] for i in chosen])
        return rows, self.counts[chosen], self.y[chosen], [self.groups[i] for i in chosen]

    def _train(self, further: bool = False) -> None:
        """Fit every member on its bootstrap sample: from scratch, or `ONLINE_ROUNDS` more rounds on top of
        the current trees (`further`)."""
        boosters = []
        for member in range(self.members):
            rows, counts, y, groups = self._member_data(member)
            pairs = ranking_pairs(y, groups, self.seed + member)
            previous = self.boosters[member] if further else None
            # every row starts at an equal share of the median program; trees trained further keep theirs
            base = (float(previous.attr("base_margin")) if previous is not None
                    else float(np.median(y) - np.log(np.mean(counts))))
            data = xgboost.DMatrix(rows, base_margin=np.full(len(rows), base, np.float32), missing=np.nan)
            params = dict(PARAMS, seed=self.seed + member)
            boosters.append(xgboost.train(params, data, ONLINE_ROUNDS if further else ROUNDS,
                                          obj=_objective(counts, y, pairs, self.rank_weight), xgb_model=previous))
            boosters[-1].set_attr(base_margin=repr(base))
        self.boosters = boosters
        self.fitted_on = len(self.y)

    def predict(self, programs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(runtimes in seconds, ensemble spread in log space) for each program's rows."""
        if not self.trained:
            raise RuntimeError("the cost model has not been trained")
        rows, counts = _stack(programs)
        if (counts == 0).any():
            raise ValueError("a program without rows cannot be predicted")
        logs = []
        for booster in self.boosters:
            base = float(booster.attr("base_margin"))
            margins = booster.inplace_predict(rows, predict_type="margin", missing=np.nan,
                                              base_margin=np.full(len(rows), base, np.float32))
            logs.append(_program_scores(margins.astype(np.float64), counts)[0])
        logs = np.stack(logs)
        return np.exp(logs.mean(0)), logs.std(0)

    def copy(self) -> CostModel:
        """An independent, unfrozen copy (boosters, data, sample keys) to learn on. The data arrays are
        shared, not copied (tens of MB): `update` and `fit` replace them instead of writing into them."""
        twin = CostModel(members=self.members, seed=self.seed, retrain_growth=self.retrain_growth,
                         rank_weight=self.rank_weight)
        twin.boosters = [booster.copy() for booster in self.boosters]
        twin.rows, twin.counts, twin.y = self.rows, self.counts, self.y  # never changed in place: shared
        twin.groups, twin.fitted_on = list(self.groups), self.fitted_on
        twin.meta, twin.sample_keys = dict(self.meta), set(self.sample_keys)
        return twin

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, directory: Path | str) -> Path:
        """Boosters as XGBoost UBJSON, training data as .npz, metadata (feature version, seed, hardware)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for i, booster in enumerate(self.boosters):
            booster.save_model(directory / f"member{i}.ubj")  # XGBoost's binary JSON: half the size
        np.savez_compressed(directory / "data.npz", rows=self.rows, counts=self.counts, y=self.y,
                            groups=np.asarray(self.groups, dtype=str))
        meta = dict(self.meta, feature_version=FEATURE_VERSION, members=len(self.boosters), seed=self.seed,
                    rank_weight=self.rank_weight, samples=int(len(self.y)),
                    machine=self.meta.get("machine") or machine_description())
        (directory / "model.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> CostModel:
        directory = Path(directory)
        meta = json.loads((directory / "model.json").read_text())
        if meta["feature_version"] != FEATURE_VERSION:
            raise RuntimeError(f"model features v{meta['feature_version']}, this code computes v{FEATURE_VERSION}")
        model = cls(members=meta["members"], seed=meta["seed"], rank_weight=meta.get("rank_weight", 1.0))
        model.meta = meta
        for i in range(meta["members"]):
            booster = xgboost.Booster()
            booster.load_model(directory / f"member{i}.ubj")
            booster.set_param({"nthread": 1})  # not saved with the model; more threads only contend
            model.boosters.append(booster)
        with np.load(directory / "data.npz", allow_pickle=False) as data:
            model.rows, model.counts, model.y = data["rows"], data["counts"], data["y"]
            model.groups = [str(g) for g in data["groups"]]
        model.fitted_on = len(model.y)
        return model


def _stack(programs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All programs' rows in one table, and the row count of each."""
    programs = [np.asarray(p, np.float32).reshape(-1, ROW_WIDTH) for p in programs]
    counts = np.asarray([len(p) for p in programs], np.int64)
    rows = np.concatenate(programs) if programs else np.zeros((0, ROW_WIDTH), np.float32)
    return rows, counts
