"""The cost model: program features, an XGBoost ensemble of log runtime, and its metrics."""
from .default import DEFAULT_MODEL_DIR, default_model
from .features import FEATURE_VERSION, Features, features, leir_features, tir_features
from .metrics import a_peak_at_k, kendall_tau, p_rmse, pairwise_accuracy, report
from .model import CostModel

__all__ = ["CostModel", "Features", "default_model", "DEFAULT_MODEL_DIR", "features", "tir_features", "leir_features",
           "FEATURE_VERSION", "a_peak_at_k", "p_rmse", "pairwise_accuracy", "kendall_tau", "report"]
