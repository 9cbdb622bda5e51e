"""Build, run and verify programs (timing, worker isolation and the result store come later)."""
from .build import Kernel, build
from .inputs import random_inputs
from .verify import VerifyReport, compare, verify

__all__ = ["Kernel", "build", "random_inputs", "VerifyReport", "compare", "verify"]
