"""Build, run, verify and time programs; worker isolation; the SQLite result store."""
from .._callable import make_callable
from .build import Kernel, build
from .inputs import random_inputs
from .paired import PairedTiming, measure_pair
from .runner import Measurement, Protocol, Remote, measure, measure_many
from .store import ResultStore, record_key
from .verify import VerifyReport, compare, verify

__all__ = ["Kernel", "build", "random_inputs", "VerifyReport", "compare", "verify", "Measurement", "Protocol", "Remote",
           "measure", "measure_many", "PairedTiming", "measure_pair", "ResultStore", "record_key"]
make_callable(__name__, measure)
