"""The cost model that ships with the package, so `model` mode works without measuring anything first.

It was trained by `benchmarks/costmodel_eval.py --save` on the suite's measurements at `small` (the
hardware and protocol are in its `model.json`); `steptp costmodel train` makes one for your own machine.
"""
from __future__ import annotations

import functools
from pathlib import Path

from .model import CostModel

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "default_model"


@functools.lru_cache(maxsize=1)
def default_model() -> CostModel:
    """The packaged model, loaded once per process and frozen: every model-mode environment shares it, so
    its predictions never change within a process; online learning (hybrid and measure modes) works on a
    `copy()`."""
    if not (DEFAULT_MODEL_DIR / "model.json").exists():
        raise FileNotFoundError(f"no packaged cost model at {DEFAULT_MODEL_DIR}; train one with "
                                "`steptp costmodel train`")
    model = CostModel.load(DEFAULT_MODEL_DIR)
    model.frozen = True
    return model
