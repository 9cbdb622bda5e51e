"""The atomic strategies: `Action`, the registry, `candidates`, `apply_action`, `identify`."""
# importing a module registers its strategies
from . import (loops, loop_kinds, memory, layouts, cache_read_write, reduction_factorization, graph,  # noqa: F401
               algebraic, online, value_splits, shared_then_correct, tensor_split_concat, eliminations)
from .base import (REGISTRY, STRATEGY_NAMES, Action, Strategy, apply_action, candidates, code_digest, get_strategy,
                   random_chain)
from .identify import canonical_text, identify

STRATEGIES = REGISTRY
"""Implemented strategies by name."""

__all__ = ["Action", "Strategy", "STRATEGIES", "STRATEGY_NAMES", "REGISTRY", "candidates", "code_digest",
           "apply_action", "identify", "canonical_text", "get_strategy", "random_chain"]
