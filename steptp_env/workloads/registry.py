"""The suite's bookkeeping: one `WorkloadSpec` per URI, its shape presets, and how inputs are drawn.

A spec's `make(p)` gets the preset's sizes as attributes of `p` and returns a `Case`: the PyTorch module
and one `Arg` per forward argument (the example tensor and the `InputRange` fresh draws come from).
`level1.py` and `level2.py` declare the specs; `__init__.py` turns them into `Workload`s.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import torch

from ..frontend.workload import InputRange

PRESETS = ("tiny", "small", "default")
"""tiny: at most ~1e5 loop iterations (tests); small: 1e6 to 3e7 (episodes, benchmarks); default: sizes
like KernelBench's (conversion only: building or running them is slow on a CPU)."""


@dataclass(frozen=True)
class Arg:
    """One forward argument: its example value and the range fresh values are drawn from."""

    tensor: torch.Tensor
    range: InputRange


@dataclass(frozen=True)
class Case:
    module: torch.nn.Module
    args: Sequence[Arg]


def uniform(*shape: int, low: float = -1.0, high: float = 1.0) -> Arg:
    """A float input drawn uniformly in [low, high]."""
    return Arg(torch.rand(*shape) * (high - low) + low, InputRange(low, high))


def positive(*shape: int, low: float = 0.1, high: float = 1.0) -> Arg:
    """A strictly positive float input (for log, sqrt, division, probabilities)."""
    return uniform(*shape, low=low, high=high)


def indices(*shape: int, high: int) -> Arg:
    """An int64 input in [0, high - 1] (class labels, positions)."""
    return Arg(torch.randint(0, high, shape, dtype=torch.int64), InputRange(0, high - 1))


def mask(*shape: int) -> Arg:
    """A bool input, each element true with probability 1/2."""
    return Arg(torch.rand(*shape) < 0.5, InputRange(0, 1))


@dataclass(frozen=True)
class WorkloadSpec:
    """A named workload: `level/name`, its family (the module class it instantiates), and its presets."""

    name: str
    level: str
    family: str
    make: Callable[[Any], Case]
    presets: Mapping[str, Mapping[str, Any]]
    doc: str = ""

    @property
    def uri(self) -> str:
        return f"{self.level}/{self.name}"

    def case(self, preset: str) -> Case:
        return self.make(SimpleNamespace(**self.presets[preset]))


SPECS: dict[str, WorkloadSpec] = {}


def register(level: str, name: str, family: str, make: Callable[[Any], Case], tiny: Mapping[str, Any],
             small: Mapping[str, Any], default: Mapping[str, Any], doc: str = "") -> WorkloadSpec:
    spec = WorkloadSpec(name, level, family, make, {"tiny": dict(tiny), "small": dict(small),
                                                     "default": dict(default)}, doc)
    if spec.uri in SPECS:
        raise ValueError(f"duplicate workload {spec.uri}")
    if spec.uri != spec.uri.lower() or " " in spec.uri:
        raise ValueError(f"workload URIs are lowercase snake_case: {spec.uri}")
    SPECS[spec.uri] = spec
    return spec


def matching(pattern: str | None) -> list[str]:
    """Sorted URIs; `pattern` is a glob (`level1/*conv*`), or a plain substring when it has no wildcard."""
    uris = sorted(SPECS)
    if pattern is None:
        return uris
    if not any(c in pattern for c in "*?["):
        return [u for u in uris if pattern in u]
    return [u for u in uris if fnmatch.fnmatchcase(u, pattern)]
