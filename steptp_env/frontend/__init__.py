"""PyTorch -> LEIR: `from_torch` turns a module into a `Workload` (no TVM, no gymnasium here)."""
from . import ops  # noqa: F401  (registers the op handlers)
from .convert import HANDLERS, UnsupportedOpError
from .workload import InputRange, Workload, from_torch, is_saved_workload

__all__ = ["from_torch", "Workload", "InputRange", "UnsupportedOpError", "HANDLERS"]
