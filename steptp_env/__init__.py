"""steptp_env: LLM- and RL-guided tensor program optimization as a measurable environment.

The LEIR core (`Program`, `Signature`, `TensorSpec`) imports without TVM; `lower`, `build` and `verify`
import TVM on first use, which takes a few seconds.
"""
from .errors import BuildError, IllegalActionError, LoweringError, ParseError, SignatureError, StepTPError
from .ir import Program, Signature, TensorSpec

__version__ = "0.4.0.dev0"  # the changelog's 0.4.0, unreleased
MAX_STEPS = 32
"""Steps per episode by default: `StepTPEnv(max_steps=)`, the Gymnasium specs' `max_episode_steps`, the CLI."""

_LAZY = {"lower": ("steptp_env.lower", "lower"), "build": ("steptp_env.measure", "build"),
         "verify": ("steptp_env.measure", "verify"), "VerifyReport": ("steptp_env.measure", "VerifyReport"),
         "measure": ("steptp_env.measure", "measure"), "Measurement": ("steptp_env.measure", "Measurement"),
         "Protocol": ("steptp_env.measure", "Protocol"), "ResultStore": ("steptp_env.measure", "ResultStore"),
         "from_torch": ("steptp_env.frontend", "from_torch"), "get_workload": ("steptp_env.workloads", "get_workload"),
         "list_workloads": ("steptp_env.workloads", "list_workloads"), "StepTPEnv": ("steptp_env.env", "StepTPEnv")}

__all__ = ["Program", "Signature", "TensorSpec", "StepTPError", "ParseError", "SignatureError", "LoweringError", "IllegalActionError",
           "BuildError", *_LAZY]


def _register() -> None:
    """Gymnasium ids; the entry point is a string, so nothing heavy is imported until `gymnasium.make`.

    Gymnasium 1.x reads no plugin entry points, so an id resolves only once this package is imported;
    `gymnasium.make("steptp_env:steptp_env/StepTP-v1")` (module prefix) imports it in the same call. The
    spec carries the env's default episode limit (`MAX_STEPS`): pass `max_episode_steps` along with a
    different `max_steps`."""
    try:
        import gymnasium
    except ImportError:  # the LEIR core works without it
        return
    modes = ("measure", "model", "hybrid")
    for version, entry_point in (("v1", "steptp_env.env:StepTPEnv"), ("v0", "steptp_env.env.catalog:retired_catalog")):
        ids = {f"steptp_env/StepTP-{version}": {}, **{f"steptp_env/StepTP-{m}-{version}": {"mode": m} for m in modes}}
        for env_id, kwargs in ids.items():
            if env_id not in gymnasium.registry:
                gymnasium.register(env_id, entry_point=entry_point, kwargs=kwargs, max_episode_steps=MAX_STEPS)


_register()


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'steptp_env' has no attribute {name!r}")
