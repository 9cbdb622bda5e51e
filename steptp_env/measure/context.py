"""What a stored measurement depends on besides the program, target and protocol: the code versions, the
machine and the workload's reference.

A record holds a verdict (equivalent to the workload's PyTorch reference, checked by this verifier) and a
timing (on this machine, with this TVM and LLVM, for this lowering). `context(workload)` hashes all of it,
and the store keys records by it (`store.record_key`, `ResultStore.find`), so a record from another
machine, another version of the code or another workload's parameters is never taken for this one: it is
measured again.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform

VERIFIER_VERSION = "1"
"""Changes whenever `verify` would give another verdict on the same program (input draws, tolerances, the
rules for NaN and inf positions): verdicts of older verifiers are not reused."""


def machine_description() -> str:
    """The CPU model and core count, as people read them."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


@functools.cache
def machine_fingerprint() -> str:
    """A short hash of the CPU model, core count and instruction-set flags: timings are comparable only on
    machines that agree on all three."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].strip() for l in f if l.startswith("flags")), "")
    except OSError:
        pass
    text = f"{machine_description()}|{platform.machine()}|{' '.join(sorted(flags.split()))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def versions() -> dict[str, str]:
    """The versions a measurement depends on, stored with each one (a fresh dict each call)."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    import numpy
    import torch
    import tvm

    from .. import __version__
    from ..lower import LOWERING_VERSION

    return {"steptp_env": __version__, "lowering": LOWERING_VERSION, "verifier": VERIFIER_VERSION,
            "tvm": tvm.__version__, "llvm": _llvm_version(tvm),
            "torch": torch.__version__, "numpy": numpy.__version__, "machine": machine_fingerprint()}


def _llvm_version(tvm) -> str:
    """The LLVM TVM was built with: the full version where libinfo has it (source builds), else the major
    version TVM's codegen reports (the PyPI wheels record only USE_LLVM)."""
    full = tvm.support.libinfo().get("LLVM_VERSION")
    if full:
        return str(full)
    major = tvm.get_global_func("target.llvm_version_major", allow_missing=True)
    return f"{major()}.x" if major is not None else "unknown"


def context(workload) -> str:
    """The hash records of `workload` are keyed by: the versions, the machine and the workload's digest."""
    text = json.dumps({"versions": versions(), "workload": workload.digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
