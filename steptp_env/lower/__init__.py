"""LEIR -> TVM TIR lowering, per target (`llvm`, `cuda`)."""
import sys
import types

from .tir import lower, target_kind

__all__ = ["lower", "target_kind"]


class _CallableModule(types.ModuleType):
    """`steptp_env.lower` names both this package and the public function `lower` (the design's API):
    once the package is imported Python binds the name to the package, so calling the package lowers."""

    def __call__(self, *args, **kwargs):
        return lower(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
