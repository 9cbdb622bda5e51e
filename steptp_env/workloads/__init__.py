"""The project's workload suite: PyTorch modules of KernelBench's families, each at three sizes.

    >>> from steptp_env.workloads import get_workload, list_workloads
    >>> list_workloads("level1/*softmax*")
    ['level1/log_softmax', 'level1/softmax', 'level1/softmax_dim1_3d']
    >>> wl = get_workload("level2/gemm_relu_divide", preset="tiny")

`level1` holds single operators, `level2` fused chains and attention blocks. Presets: `tiny` (at most
~1e5 loop iterations, for tests), `small` (1e6 to 3e7, for episodes and benchmarks), `default`
(KernelBench-like sizes). Parameters and example inputs are drawn under a torch seed derived from the URI
(crc32), so a URI always gives the same program and the same parameter values.
"""
from __future__ import annotations

import difflib
import zlib
from pathlib import Path

import torch

from ..errors import StepTPError
from ..frontend.workload import Workload, from_torch, is_saved_workload
from . import level1, level2  # noqa: F401  (they register the specs)
from .registry import PRESETS, SPECS, WorkloadSpec, matching


class UnknownWorkloadError(StepTPError, KeyError):
    """A URI or preset that is not in the suite; the message lists close matches."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


ALIASES = {"level1/matmul": "level1/matmul_square", "level1/conv2d": "level1/conv2d_square_input_square_kernel"}
"""Short names the docs use for common workloads."""


def spec(uri: str) -> WorkloadSpec:
    """The spec of a URI (`level1/softmax`), or `UnknownWorkloadError` with the closest names."""
    found = SPECS.get(ALIASES.get(uri, uri))
    if found is not None:
        return found
    close = difflib.get_close_matches(uri, SPECS, n=5, cutoff=0.5)
    if not close:  # try the name without its level, for `softmax` or `level2/softmax`
        names = {s.name: u for u, s in SPECS.items()}
        close = [names[n] for n in difflib.get_close_matches(uri.rsplit("/", 1)[-1], names, n=5, cutoff=0.5)]
    hint = f"; close matches: {', '.join(close)}" if close else "; see `steptp workloads list`"
    raise UnknownWorkloadError(f"unknown workload {uri!r}{hint}")


def seed_of(uri: str) -> int:
    """The torch seed a workload is built under (stable across processes, unlike `hash`)."""
    return zlib.crc32(uri.encode())


def get_workload(uri: str | Path, preset: str = "small", dtype: str = "float32") -> Workload:
    """Build the suite workload `uri` at `preset` (tiny, small, default) in `dtype` (float32, float64,
    float16). Raises `UnknownWorkloadError` for an unknown URI or preset, `UnsupportedOpError` when the
    frontend cannot translate the module.

    `uri` may also be the folder of a saved workload (`Workload.save`): it is loaded as it was saved, its
    preset with it, without running anything from the folder (`Workload.load`); a `dtype` other than the
    saved program's is refused."""
    if is_saved_workload(uri):
        return _saved_workload(str(uri), dtype)
    uri = ALIASES.get(uri, uri)
    entry = spec(uri)
    if preset not in entry.presets:
        raise UnknownWorkloadError(f"unknown preset {preset!r} for {uri}; choose one of {', '.join(PRESETS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_of(uri))
        case = entry.case(preset)
    return from_torch(case.module, [a.tensor for a in case.args], dtype=dtype, uri=uri, preset=preset,
                      input_ranges=[a.range for a in case.args])


def _saved_workload(folder: str, dtype: str) -> Workload:
    workload = Workload.load(folder)
    saved = sorted({t.dtype for t in workload.program.signature.tensors if t.dtype.startswith("float")})
    if saved and dtype not in saved:
        raise UnknownWorkloadError(f"the workload saved in {folder} is {', '.join(saved)}, not {dtype}: pass "
                                   f"dtype={saved[0]!r} (--dtype {saved[0]}) or save it in {dtype}")
    return workload


def list_workloads(filter: str | None = None) -> list[str]:  # noqa: A002  (the documented name)
    """Sorted URIs; `filter` is a glob such as `level1/*conv*` (a plain string matches as a substring)."""
    return matching(filter)


__all__ = ["get_workload", "list_workloads", "spec", "seed_of", "UnknownWorkloadError", "PRESETS", "SPECS",
           "WorkloadSpec"]
