"""LEIR -> TVM TIR lowering, per target (`llvm`, `cuda`)."""
from .._callable import make_callable
from .tir import LOWERING_VERSION, lower, lower_by_nest, target_kind

__all__ = ["LOWERING_VERSION", "lower", "lower_by_nest", "target_kind"]
make_callable(__name__, lower)
