"""The Gymnasium environment: `StepTPEnv`, its action catalog, runtime oracle and replayable state.

`import steptp_env` registers `steptp_env/StepTP-v1` (mode chosen by argument, `hybrid` by default) and
one id per reward mode: `steptp_env/StepTP-measure-v1`, `-model-v1`, `-hybrid-v1`. The v0 ids (the first
release's catalog) raise an error that says so (`catalog.retired_catalog`).
"""
from .catalog import SLOTS, STOP, ActionCatalog
from .core import FEATURES, StepTPEnv
from .runtime import MODES, Estimate, RuntimeOracle
from .state import EnvState

__all__ = ["StepTPEnv", "EnvState", "ActionCatalog", "RuntimeOracle", "Estimate", "MODES", "SLOTS", "STOP",
           "FEATURES"]
