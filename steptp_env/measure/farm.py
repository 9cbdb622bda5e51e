"""A measurement farm: the TVM RPC servers registered with one tracker under one device key.

`measure_farm` keeps as many measurements in flight as the tracker has servers of the key (or
`concurrency`), each in a build worker of its own: it builds the program here, leases a free device from
the tracker (which queues the request while all are busy), verifies and times the kernel there, and ends
the lease. A measurement whose device was lost (its lease or upload failed, or the server no longer
accepts connections after a failed run: a killed server, a lost network) is sent again, to whichever device
the tracker gives next, up to `retries` times; a failure on a device that is still up is the program's and
stays one. So each program gets exactly one result, which names its device (`Measurement.device`); the
attempts lost with a device are counted in `FarmReport.resent`, not returned.
"""
from __future__ import annotations

import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..ir.program import Program
from .runner import UPLOAD, Measurement, Protocol, Remote, map_in_slots, measure, worker_for
from .verify import Reference


@dataclass
class FarmReport:
    """Results in input order, measurements per device, and the attempts sent again after a device loss."""

    results: list[Measurement]
    by_device: Counter = field(default_factory=Counter)
    resent: list[str] = field(default_factory=list)


def devices(tracker: Remote | str) -> int:
    """Servers of the tracker's key that are registered now (free or leased)."""
    from tvm import rpc

    remote = Remote.of(tracker)
    client = rpc.connect_tracker(remote.host, remote.port)
    try:
        summary = client.summary()
    finally:
        client.close()
    return sum(1 for server in summary["server_info"] if server["key"].split(":")[-1] == remote.key)


def _alive(device: str, timeout: float = 2.0) -> bool:
    host, _, port = device.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _lost_device(m: Measurement) -> bool:
    """Whether a failed measurement failed because its device went away, not because of its program."""
    if m.error is None:
        return False
    if m.error.startswith(UPLOAD):
        return True
    return m.device is not None and not _alive(m.device)


def measure_farm(programs: Sequence[Program], workload: Reference, tracker: Remote | str, target: str = "llvm",
                 protocol: Protocol | None = None, concurrency: int | None = None, retries: int = 3,
                 done: Callable[[int, Measurement], None] | None = None) -> FarmReport:
    """Measure every program on the farm behind `tracker` (`rpc://host:port/key`); see the module docstring.
    `done(index, measurement)` is called as each program's result is final."""
    protocol = protocol or Protocol()
    remote = Remote.of(tracker)
    report = FarmReport([])
    lock = threading.Lock()

    def one(index: int, slot: int) -> Measurement:
        for attempt in range(retries + 1):
            m = measure(programs[index], workload, target, protocol, worker_for(protocol.threads, 1000 + slot),
                        remote=remote)
            if attempt == retries or not _lost_device(m):
                break
            with lock:
                report.resent.append(f"program {index} on {m.device or 'no device'}: {m.error}")
        with lock:
            report.by_device[m.device or "none"] += 1
        if done is not None:
            done(index, m)
        return m

    report.results = map_in_slots(one, range(len(programs)), max(1, concurrency or devices(remote)))
    return report
