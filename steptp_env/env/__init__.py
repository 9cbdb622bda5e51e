"""The Gymnasium environment: `StepTPEnv`, its action catalog, runtime oracle and replayable state.

`import steptp_env` registers `steptp_env/StepTP-v0` (mode chosen by argument, `hybrid` by default) and
one id per reward mode: `steptp_env/StepTP-measure-v0`, `-model-v0`, `-hybrid-v0`.
"""
from .catalog import SLOTS, STOP, ActionCatalog
from .core import FEATURES, StepTPEnv
from .runtime import MODES, Estimate, RuntimeOracle
from .state import EnvState

__all__ = ["StepTPEnv", "EnvState", "ActionCatalog", "RuntimeOracle", "Estimate", "MODES", "SLOTS", "STOP",
           "FEATURES"]
