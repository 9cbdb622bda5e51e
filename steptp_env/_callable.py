"""Packages whose name is also a public function (`steptp_env.lower`, `steptp_env.measure`).

Once a subpackage is imported Python binds its name in the parent to the package, hiding a function of
the same name exported there; making the package module callable keeps `steptp_env.lower(...)` working."""
from __future__ import annotations

import sys
import types
from typing import Callable


def make_callable(module_name: str, fn: Callable) -> None:
    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return fn(*args, **kwargs)

    sys.modules[module_name].__class__ = CallableModule
