"""Cost-model quality as the tensor-compiler literature reports it (TenSet/TVM: a-peak@k and p-rmse),
plus ranking quality inside each workload (pairwise accuracy, Kendall tau)."""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from scipy.stats import kendalltau


def _groups(groups: Sequence[str]) -> dict[str, np.ndarray]:
    found: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        found.setdefault(g, []).append(i)
    return {g: np.asarray(ix) for g, ix in found.items()}


def a_peak_at_k(pred_s: Sequence[float], true_s: Sequence[float], groups: Sequence[str], k: int = 32) -> float:
    """Mean over workloads of (best true throughput among the k programs predicted fastest) / (best true
    throughput of the workload): 1.0 means the model's top k always contains the real best."""
    pred, true = np.asarray(pred_s), np.asarray(true_s)
    scores = []
    for ix in _groups(groups).values():
        top = ix[np.argsort(pred[ix], kind="stable")[:k]]
        scores.append(true[ix].min() / true[top].min())
    return float(np.mean(scores))


def p_rmse(pred_s: Sequence[float], true_s: Sequence[float], groups: Sequence[str]) -> float:
    """RMSE of throughput normalised by each workload's best true throughput (predicted and true)."""
    pred, true = np.asarray(pred_s), np.asarray(true_s)
    errors = []
    for ix in _groups(groups).values():
        best = (1.0 / true[ix]).max()
        errors.extend(((1.0 / pred[ix]) / best - (1.0 / true[ix]) / best) ** 2)
    return float(np.sqrt(np.mean(errors)))


def pairwise_accuracy(pred_s: Sequence[float], true_s: Sequence[float], groups: Sequence[str],
                      tie: float = 0.01) -> float:
    """Fraction of pairs inside a workload whose order (which is faster) the model gets right; pairs
    whose true runtimes differ by at most `tie` (relative) are skipped as ties: a larger `tie` leaves out
    pairs whose measured order is itself within measurement noise."""
    pred, true = np.asarray(pred_s), np.asarray(true_s)
    right = total = 0
    for ix in _groups(groups).values():
        for i, j in itertools.combinations(ix, 2):
            if abs(true[i] - true[j]) <= tie * min(true[i], true[j]):
                continue
            total += 1
            right += (pred[i] < pred[j]) == (true[i] < true[j])
    return right / total if total else float("nan")


def kendall_tau(pred_s: Sequence[float], true_s: Sequence[float], groups: Sequence[str]) -> float:
    """Mean Kendall tau between predicted and true runtimes inside each workload."""
    pred, true = np.asarray(pred_s), np.asarray(true_s)
    taus = [kendalltau(pred[ix], true[ix]).statistic for ix in _groups(groups).values() if len(ix) > 2]
    taus = [t for t in taus if not np.isnan(t)]
    return float(np.mean(taus)) if taus else float("nan")


def report(pred_s, true_s, groups, k: int = 32) -> dict[str, float]:
    return {f"a-peak@{k}": a_peak_at_k(pred_s, true_s, groups, k), "p-rmse": p_rmse(pred_s, true_s, groups),
            "pairwise_accuracy": pairwise_accuracy(pred_s, true_s, groups),
            "pairwise_accuracy_5pct": pairwise_accuracy(pred_s, true_s, groups, tie=0.05),
            "kendall_tau": kendall_tau(pred_s, true_s, groups)}
