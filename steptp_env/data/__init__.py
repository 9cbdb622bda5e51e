"""Recorded trajectories and datasets: the `Recorder` wrapper and its trajectory files, filters for
balance, exporters (Step-TP chat rows, grounded rows, whole-episode conversations, Hugging Face folders,
Minari), row validation, large-scale generation, the import of Step-TP chat rows, and reading the Step-TP
reference corpus. Submodules import what they need on use (TVM, the env, minari)."""

__all__ = ["Recorder"]


def __getattr__(name: str):
    """`from steptp_env.data import Recorder` without importing every submodule (and TVM) with the package."""
    if name == "Recorder":
        from .recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'steptp_env.data' has no attribute {name!r}")
